"""Outbound notifications: endpoints set in the admin, sent on the failure hook's events and on a budget window
reaching its soft hold, queued by the job's worker and delivered by `manage.py notify_worker` to a real local HTTP
receiver, which checks each request's signature and answers as the test scripts it (errors first, to see retries)."""

import hashlib
import hmac
import json
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.notifications import services
from apps.notifications.models import Endpoint, Event, Notification, NotificationStatus, Style
from apps.worker.models import Outcome, Run
from tests.conftest import ROOT, wait_for
from tests.jobspecs import MARKER, enqueue_spec, marked_spec

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "notify-signing-secret-5d1c"
VARIABLE = "PI_NOTIFY_SECRET_OPS"


class Receiver:
    """A local HTTP endpoint: records every POST (headers and body) and answers the next scripted status."""

    def __init__(self, statuses=(200,)):
        self.statuses = list(statuses)
        self.requests: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.requests.append({"headers": dict(self.headers), "body": body, "path": self.path})
                status = receiver.statuses.pop(0) if len(receiver.statuses) > 1 else receiver.statuses[0]
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/T000/secret-path"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    made = []

    def make(statuses=(200,)):
        made.append(Receiver(statuses))
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.fixture
def notify_worker(worker_env):
    def run(**env):
        # The test's receivers listen on loopback, an internal address this host names as allowed.
        result = subprocess.run([sys.executable, "manage.py", "notify_worker", "--burst"], cwd=ROOT,
                                env={**worker_env, VARIABLE: SECRET, "PI_NOTIFY_INTERNAL_HOSTS": "127.0.0.1", **env},
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        return result

    return run


def signature_ok(request: dict, secret: str = SECRET) -> bool:
    headers = request["headers"]
    expected = "sha256=" + hmac.new(secret.encode(), headers["X-Pidispatch-Timestamp"].encode() + b"." +
                                    request["body"], hashlib.sha256).hexdigest()
    return hmac.compare_digest(headers.get("X-Pidispatch-Signature", ""), expected)


def test_a_failure_is_queued_by_the_worker_then_delivered_signed_and_retried(
        receiver, run_worker, notify_worker, admin_client):
    endpoint_at = receiver([500, 200])
    endpoint = Endpoint.objects.create(name="ops", url=endpoint_at.url, secret_variable=VARIABLE)
    Endpoint.objects.create(name="off", url=endpoint_at.url, enabled=False)
    job_id = enqueue_spec(marked_spec("gh-notify-1", body="fake-agent:exit=2"))

    run_worker("pi-jobs", env_overrides={"PI_PUBLIC_URL": "https://pi.example.invalid", "PI_NOTIFY_RETRY_SECONDS": "1"})

    assert Run.objects.get(job_id=job_id).reason == "runner-policy"
    [delivery] = Notification.objects.all()
    assert (delivery.endpoint, delivery.event, delivery.subject, delivery.status) == (
        endpoint, Event.FAILURE, job_id, NotificationStatus.PENDING)
    assert endpoint_at.requests == []  # the job's worker only queued it

    result = notify_worker()
    assert len(endpoint_at.requests) == 1  # the second try waits out its backoff (1 s here)
    wait_for(lambda: notify_worker() and len(endpoint_at.requests) == 2, timeout=30, interval=0.5,
             what="the second try")

    assert len(endpoint_at.requests) == 2 and all(signature_ok(request) for request in endpoint_at.requests)
    assert not signature_ok(endpoint_at.requests[0], secret="another secret")
    body = json.loads(endpoint_at.requests[-1]["body"])
    assert (body["event"], body["subject"], body["data"]["jobId"], body["data"]["reason"]) == (
        "failure", job_id, job_id, "runner-policy")
    assert body["data"]["runUrl"].startswith("https://pi.example.invalid/admin/worker/run/")
    assert MARKER not in endpoint_at.requests[-1]["body"].decode()
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == (NotificationStatus.DELIVERED, 2)
    assert [(row.number, row.status_code, row.error) for row in delivery.tries.all()] == [
        (1, 500, "http-500"), (2, 200, "")]
    assert SECRET not in result.stdout + result.stderr + json.dumps(list(Notification.objects.values("document")))

    # Every try is on the delivery's admin page; the endpoint list shows no URL path (Slack's hold a credential).
    page = admin_client.get(reverse("admin:notifications_notification_change", args=[delivery.pk])).content.decode()
    assert "<p>http-500</p>" in page and "<p>500</p>" in page and ">Delivered<" in page
    listing = admin_client.get(reverse("admin:notifications_endpoint_changelist")).content.decode()
    assert "secret-path" not in listing


def test_a_delivery_that_keeps_failing_is_failed_after_its_tries_and_can_be_delivered_again(
        receiver, notify_worker, admin_client, settings):
    # The retry policy is the queueing process's: three tries, at once one after the other.
    settings.PI_NOTIFY_ATTEMPTS, settings.PI_NOTIFY_RETRY_SECONDS = 3, 0
    endpoint_at = receiver([503, 503, 503, 200])
    Endpoint.objects.create(name="chat", url=endpoint_at.url, style=Style.SLACK)
    [delivery] = services.notify(Event.FAILURE, "gh-notify-2", {"jobId": "gh-notify-2", "outcome": "failed",
                                                                "reason": "runner-infra", "target": "acme/web#7"})
    assert services.notify(Event.FAILURE, "gh-notify-2", {"jobId": "gh-notify-2"}) == []  # once per subject

    notify_worker()

    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, len(endpoint_at.requests)) == (NotificationStatus.FAILED, 3, 3)
    assert "X-Pidispatch-Signature" not in endpoint_at.requests[0]["headers"]  # no secret named: unsigned
    assert json.loads(endpoint_at.requests[0]["body"]) == {
        "text": "pidispatch: failure gh-notify-2 failed (runner-infra) acme/web#7"}

    response = admin_client.post(reverse("admin:notifications_notification_changelist"),
                                 {"action": "deliver_again", "_selected_action": [delivery.pk]}, follow=True)
    assert f"Queued again: {delivery.pk}." in response.content.decode()
    notify_worker()
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, len(endpoint_at.requests)) == (NotificationStatus.DELIVERED, 4, 4)


def test_a_window_reaching_its_soft_hold_is_notified_once(receiver, run_worker, notify_worker):
    endpoint_at = receiver([200])
    Endpoint.objects.create(name="budget", url=endpoint_at.url, on_failure=False, secret_variable=VARIABLE)
    jobs = [enqueue_spec(marked_spec(f"gh-notify-hold-{index}")) for index in range(4)]

    run_worker("pi-jobs", env_overrides={"PI_DAILY_CAP": "4", "PI_SOFT_HOLD_PCT": "50"})

    reasons = [Run.objects.get(job_id=job).reason for job in jobs]
    assert reasons == ["", "", "soft-hold", "soft-hold"]
    assert Run.objects.filter(outcome=Outcome.COMPLETED).count() == 2
    [delivery] = Notification.objects.all()
    assert (delivery.event, delivery.subject) == (Event.SOFT_HOLD, f"day:{timezone.now().date().isoformat()}")

    notify_worker()

    [request] = endpoint_at.requests
    assert signature_ok(request)
    assert json.loads(request["body"])["data"] == {"event": "soft-hold", "window": "day",
                                                   "period": timezone.now().date().isoformat(),
                                                   "jobId": jobs[2], "reason": "soft-hold"}


def test_a_signing_secret_must_be_named_by_a_notify_variable(admin_client, settings):
    settings.PI_NOTIFY_INTERNAL_HOSTS = ["127.0.0.1"]
    response = admin_client.post(reverse("admin:notifications_endpoint_add"), {
        "name": "x", "url": "http://127.0.0.1:9/", "style": "json", "secret_variable": "ANTHROPIC_API_KEY",
        "on_failure": "on", "enabled": "on"})
    assert response.status_code == 200 and "PI_NOTIFY_SECRET_" in response.content.decode()
    assert not Endpoint.objects.exists()


# --- no notification to an internal address (issue 47 §4) ---------------------------------------------------------

@pytest.mark.parametrize("url", [
    "http://127.0.0.1:6379/", "http://localhost:8000/admin/", "http://169.254.169.254/latest/meta-data/",
    "http://[::1]:5432/", "http://10.1.2.3/hook", "http://192.168.0.10/hook", "http://100.64.0.1/hook",
    "http://0.0.0.0:6379/", "http://[::ffff:127.0.0.1]/", "http://[fd00::1]/", "http://[2002:7f00:1::]/",
    "http://user:password@hooks.example.com/", "ftp://hooks.example.com/", "gopher://127.0.0.1:6379/_INFO",
])
def test_an_endpoint_at_an_internal_address_is_refused_when_saved(url, admin_client):
    response = admin_client.post(reverse("admin:notifications_endpoint_add"), {
        "name": "internal", "url": url, "style": "json", "on_failure": "on", "enabled": "on"})
    assert response.status_code == 200 and not Endpoint.objects.exists()
    page = response.content.decode()
    assert "internal address" in page or "user name or password" in page or "http:// and https://" in page \
        or "Enter a valid URL" in page


def test_an_internal_host_the_deployment_names_may_be_saved(admin_client, settings):
    settings.PI_NOTIFY_INTERNAL_HOSTS = ["localhost", "10.20.0.0/16"]
    for name, url in (("local", "http://localhost:8123/hook"), ("lan", "http://10.20.3.4/hook")):
        admin_client.post(reverse("admin:notifications_endpoint_add"), {
            "name": name, "url": url, "style": "json", "on_failure": "on", "enabled": "on"})
    assert sorted(Endpoint.objects.values_list("name", flat=True)) == ["lan", "local"]


def test_a_try_to_an_internal_address_reaches_nothing_and_says_why(receiver, notify_worker, settings):
    """An endpoint saved before this check (or written past the admin): each try judges it again."""
    settings.PI_NOTIFY_ATTEMPTS, settings.PI_NOTIFY_RETRY_SECONDS = 2, 0
    endpoint_at = receiver([200])
    Endpoint.objects.create(name="loopback", url=endpoint_at.url)
    [delivery] = services.notify(Event.FAILURE, "gh-notify-ssrf", {"jobId": "gh-notify-ssrf"})

    notify_worker(PI_NOTIFY_INTERNAL_HOSTS="")

    delivery.refresh_from_db()
    assert endpoint_at.requests == []
    assert (delivery.status, [row.error for row in delivery.tries.all()]) == (
        NotificationStatus.FAILED, ["internal-address", "internal-address"])


def test_a_name_is_resolved_again_at_each_try_and_the_try_goes_where_it_was_judged(
        receiver, settings, monkeypatch):
    """A DNS answer that changes between the save and the try (rebinding) cannot be served here: the resolver is
    the one stand-in; the receiver and the notifier are real."""
    from apps.notifications import delivery as notifier

    endpoint_at = receiver([200])
    port = endpoint_at.server.server_address[1]
    answers = {"hooks.example.test": "93.184.215.14"}  # a public address when the endpoint is saved
    real = socket.getaddrinfo

    def resolve(host, port, *args, **kwargs):
        if host in answers:
            return [(2, 1, 6, "", (answers[host], port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr("apps.notifications.destination.socket.getaddrinfo", resolve)
    endpoint = Endpoint(name="rebinding", url=f"http://hooks.example.test:{port}/hook")
    endpoint.full_clean()
    endpoint.save()
    answers["hooks.example.test"] = "127.0.0.1"  # ... and loopback at the try
    [refused] = services.notify(Event.FAILURE, "gh-notify-rebind", {"jobId": "gh-notify-rebind"})
    with pytest.raises(notifier.DeliveryFailed):
        notifier.deliver(refused.pk)
    assert endpoint_at.requests == [] and refused.tries.get().error == "internal-address"

    # Named as internal, the try connects to the address it judged (never resolving again), as the name it gave.
    settings.PI_NOTIFY_INTERNAL_HOSTS = ["hooks.example.test"]
    [allowed] = services.notify(Event.FAILURE, "gh-notify-named", {"jobId": "gh-notify-named"})
    assert notifier.deliver(allowed.pk) == NotificationStatus.DELIVERED
    [request] = endpoint_at.requests
    assert request["headers"]["Host"] == f"hooks.example.test:{port}" and request["path"] == "/hook"


def test_a_redirect_is_never_followed(receiver, settings):
    from apps.notifications import delivery as notifier

    settings.PI_NOTIFY_INTERNAL_HOSTS = ["127.0.0.1"]
    endpoint_at = receiver([302])
    Endpoint.objects.create(name="moved", url=endpoint_at.url)
    [delivery] = services.notify(Event.FAILURE, "gh-notify-302", {"jobId": "gh-notify-302"})
    with pytest.raises(notifier.DeliveryFailed):
        notifier.deliver(delivery.pk)
    assert len(endpoint_at.requests) == 1 and delivery.tries.get().error == "http-302"
