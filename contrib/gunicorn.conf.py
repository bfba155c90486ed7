"""gunicorn's configuration for pidispatch's web server and public edge (contrib/systemd/pidispatch-web.service,
pidispatch-edge.service): `gunicorn -c contrib/gunicorn.conf.py`.

The stop: systemd sends SIGTERM to gunicorn's master only (KillMode=mixed); the master stops accepting, lets each
worker finish the request it is serving for up to `graceful_timeout` seconds, and exits 0. The units' TimeoutStopSec
is longer than that (tests/site/test_deploy_units.py checks it), so systemd never SIGKILLs a request mid-answer.
"""

import os

wsgi_app = "pidispatch_site.wsgi"
bind = [address.strip() for address in os.environ.get("PI_WEB_BIND", "127.0.0.1:8000").split(",") if address.strip()]
workers = int(os.environ.get("PI_WEB_WORKERS", "4"))

# A webhook is answered in milliseconds and an admin page in well under a second; the slowest requests are the cost
# page's first view of a cold history (about a second) and the API's deep pages.
timeout = 60
graceful_timeout = 30
keepalive = 5

# Behind the reverse proxy on this host (contrib/nginx/pidispatch.conf): its X-Forwarded-* headers are trusted from
# these addresses only, and Django's DJANGO_SECURE reads X-Forwarded-Proto, which the proxy sets on every request.
forwarded_allow_ips = "127.0.0.1,::1"

# Logs go to stdout and stderr, which systemd gives to the journal. The access log names the path and never the
# query string (a search in the admin may hold a person's name); no user agent, no referrer.
accesslog = "-"
errorlog = "-"
access_log_format = '%(h)s "%(m)s %(U)s %(H)s" %(s)s %(B)s %(M)sms'

# No control socket: the web server and the edge run side by side as one user, and systemd is what steers them.
control_socket_disable = True
