"""The ASGI entry point (the deployment serves WSGI: pidispatch_site/wsgi.py)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pidispatch_site.settings")

application = get_asgi_application()

from apps.receiver.forge_config import forge_config  # noqa: E402

forge_config()
