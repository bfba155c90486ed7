"""Forge configuration: served when configured, refusing to start when incomplete (clear messages), our own
identity resolved through the API when `<FORGE>_SELF_ID` is unset, and the public edge."""

import importlib
import os
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.urls import clear_url_caches

from apps.receiver import forge_config as config_module
from apps.receiver.forge_config import ForgeConfigError, forge_config, forge_settings, self_identity
from apps.receiver.models import Delivery, DeliveryStatus
from tests.conftest import ROOT
from tests.receiver_support import dumps, gitlab_token_headers, load, post, rule

pytestmark = pytest.mark.django_db


@pytest.fixture
def bare(settings):
    """No forge configured at all (the suite's default configures GitHub)."""
    settings.GITHUB_WEBHOOK_SECRET = ""
    settings.GITHUB_SELF_ID = ""
    return settings


@pytest.mark.parametrize("values, message", [
    ({"GITHUB_SELF_ID": "1"}, "GITHUB_WEBHOOK_SECRET is required when GitHub is configured"),
    ({"GITHUB_WEBHOOK_SECRET": "s"}, "GITHUB_SELF_ID is required when GitHub is configured and GITHUB_TOKEN is unset"),
    ({"GITHUB_WEBHOOK_SECRET": "s", "GITHUB_SELF_ID": "pi-bot"}, "GITHUB_SELF_ID must be the numeric GitHub user id"),
    ({"GITLAB_WEBHOOK_SECRET": "s", "GITLAB_TOKEN": "t", "GITLAB_SELF_ID": "1"}, "GITLAB_WEBHOOK_MODE must be `token`"),
    ({"GITLAB_WEBHOOK_MODE": "hmac", "GITLAB_WEBHOOK_SECRET": "s"}, "GITLAB_WEBHOOK_MODE must be `token`"),
    ({"GITLAB_WEBHOOK_MODE": "token", "GITLAB_TOKEN": "t"}, "GITLAB_WEBHOOK_SECRET is required"),
    ({"GITLAB_WEBHOOK_MODE": "token", "GITLAB_WEBHOOK_SECRET": "s"}, "GITLAB_TOKEN is required"),
    ({"GITLAB_WEBHOOK_MODE": "signature", "GITLAB_WEBHOOK_SECRET": "whsec_!!!", "GITLAB_TOKEN": "t",
      "GITLAB_SELF_ID": "1"}, "must be the webhook's signing token"),
    ({"FORGEJO_WEBHOOK_SECRET": "s", "FORGEJO_TOKEN": "t", "FORGEJO_SELF_ID": "1"}, "FORGEJO_URL is required"),
    ({"FORGEJO_SELF_ID": "1", "FORGEJO_URL": "https://x", "FORGEJO_TOKEN": "t"}, "FORGEJO_WEBHOOK_SECRET is required"),
    ({"AZURE_WEBHOOK_SECRET": "u:p"}, "AZURE_WEBHOOK_MODE must be `basic`"),
    ({"AZURE_WEBHOOK_MODE": "header", "AZURE_WEBHOOK_SECRET": "v", "AZURE_ORG_URL": "https://dev.azure.com/x",
      "AZURE_TOKEN": "t", "AZURE_SELF_ID": "g"}, "AZURE_WEBHOOK_HEADER is required"),
    ({"AZURE_WEBHOOK_MODE": "basic", "AZURE_WEBHOOK_SECRET": "u:p", "AZURE_TOKEN": "t", "AZURE_SELF_ID": "g"},
     "AZURE_ORG_URL is required"),
])
def test_incomplete_forges_refuse_to_start_with_a_clear_message(bare, values, message):
    for name, value in values.items():
        setattr(bare, name, value)
    with pytest.raises(ForgeConfigError, match=message):
        forge_config()
    with pytest.raises(SystemCheckError, match=message):  # `manage.py check` says the same, without any network
        call_command("check")


def _start_the_wsgi_module(**forge_env) -> subprocess.CompletedProcess:
    """What gunicorn does in each worker: import pidispatch_site.wsgi, in a fresh process."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("GITHUB_", "GITLAB_", "FORGEJO_", "AZURE_"))}
    env.update(forge_env)
    report = "import sys; import pidispatch_site.wsgi; print('apps.receiver.views' in sys.modules)"
    return subprocess.run([sys.executable, "-c", report], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_wsgi_module_refuses_to_serve_an_unverifiable_forge_and_starts_ready_otherwise():
    refused = _start_the_wsgi_module(GITHUB_SELF_ID="1")
    assert refused.returncode != 0 and "GITHUB_WEBHOOK_SECRET is required" in refused.stderr

    started = _start_the_wsgi_module(GITHUB_SELF_ID="1", GITHUB_WEBHOOK_SECRET="s")
    assert started.returncode == 0, started.stderr
    # Every view is imported before the first request: one that cannot be imported stops the start.
    assert started.stdout.split() == ["True"]


def test_a_worker_host_with_only_api_tokens_serves_no_webhooks(bare):
    bare.GITLAB_TOKEN = "glpat-for-clones"
    bare.FORGEJO_TOKEN = "for-clones"
    assert forge_config().served() == []
    call_command("check")


def test_configured_forges_are_served(forges):
    assert forge_config().served() == ["github", "gitlab", "forgejo", "azure"]


def test_self_identity_is_resolved_through_the_api_at_start(bare, fake_forge):
    bare.GITLAB_WEBHOOK_MODE, bare.GITLAB_WEBHOOK_SECRET = "token", "s"
    bare.GITLAB_TOKEN, bare.GITLAB_URL = "glpat-t", fake_forge.url
    fake_forge.routes["/api/v4/user"] = (200, {"id": 5150, "username": "pi-bot"})

    forge_config()

    assert fake_forge.paths() == ["/api/v4/user"]
    assert self_identity("gitlab").id == "5150"
    assert fake_forge.paths() == ["/api/v4/user"]  # asked once per process


def test_a_token_the_forge_refuses_stops_the_start(bare, fake_forge):
    bare.FORGEJO_WEBHOOK_SECRET, bare.FORGEJO_URL, bare.FORGEJO_TOKEN = "s", fake_forge.url, "repo-scoped"
    fake_forge.routes["/api/v1/user"] = (401, {"message": "token does not have the read:user scope"})

    with pytest.raises(ForgeConfigError, match="the API refused FORGEJO_TOKEN .status-401.. Fix the token, or set "
                                               "FORGEJO_SELF_ID"):
        forge_config()


def test_an_unreachable_forge_at_start_keeps_deliveries_until_the_identity_is_known(
        bare, fake_forge, client, redis_conn, monkeypatch):
    from apps.receiver import intake

    bare.GITLAB_WEBHOOK_MODE, bare.GITLAB_WEBHOOK_SECRET = "token", "gitlab-shared-token"
    bare.GITLAB_TOKEN, bare.GITLAB_URL = "glpat-t", fake_forge.url
    fake_forge.routes["/api/v4/user"] = (503, {"message": "starting"})
    forge_config()  # starts anyway: the forge is only unreachable, not refusing
    rule(position=0, kind="gitlab", on_type="label", label_any=["pi"], flow="fix-bug")
    body = dumps(load("gitlab/issue_update_labels.json"))

    response = post(client, "gitlab", body, gitlab_token_headers("Issue Hook", "idem-early"))

    assert response.json() == {"status": "accepted"}
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.reason) == (DeliveryStatus.PENDING, "identity-unknown")

    fake_forge.routes["/api/v4/user"] = (200, {"id": 5150})
    fake_forge.gitlab_member("4711", 1201, 30)
    monkeypatch.setattr(config_module, "IDENTITY_RETRY_SECONDS", 0)
    assert intake.replay(delivery).body == {"status": "queued", "jobs": ["gl-idem-early"]}


def test_a_delivery_is_stored_before_our_identity_is_asked_of_the_forge(
        bare, fake_forge, client, redis_conn, monkeypatch):
    """Learning our identity is an API call (up to the forge's timeout): a process that dies meanwhile must
    leave a row for the replayer."""
    bare.GITLAB_WEBHOOK_MODE, bare.GITLAB_WEBHOOK_SECRET = "token", "gitlab-shared-token"
    bare.GITLAB_TOKEN, bare.GITLAB_URL = "glpat-t", fake_forge.url
    fake_forge.routes["/api/v4/user"] = (503, {"message": "starting"})
    forge_config()  # deferred: the forge is unreachable at start
    rule(position=0, kind="gitlab", on_type="label", label_any=["pi"], flow="fix-bug")
    fake_forge.routes["/api/v4/user"] = (200, {"id": 5150})
    fake_forge.gitlab_member("4711", 1201, 30)
    monkeypatch.setattr(config_module, "IDENTITY_RETRY_SECONDS", 0)
    rows_while_asking = []
    real_resolve = config_module._resolve

    def resolve(forge):
        rows_while_asking.extend(Delivery.objects.values_list("delivery_id", "status"))
        return real_resolve(forge)

    monkeypatch.setattr(config_module, "_resolve", resolve)
    body = dumps(load("gitlab/issue_update_labels.json"))

    response = post(client, "gitlab", body, gitlab_token_headers("Issue Hook", "idem-asking"))

    assert response.json() == {"status": "queued", "jobs": ["gl-idem-asking"]}
    assert rows_while_asking == [("idem-asking", DeliveryStatus.RECEIVED)]
    assert Delivery.objects.get().payload is None


def test_settings_changes_are_picked_up(settings):
    settings.GITHUB_WEBHOOK_SECRET = "one"
    assert forge_settings().github.webhook_secret == b"one"
    settings.GITHUB_WEBHOOK_SECRET = "two"
    assert forge_settings().github.webhook_secret == b"two"


# --- the public edge -----------------------------------------------------------------------------------------

@pytest.fixture
def public_edge(settings):
    import pidispatch_site.urls

    settings.PI_PUBLIC_EDGE = True
    importlib.reload(pidispatch_site.urls)
    clear_url_caches()
    yield
    settings.PI_PUBLIC_EDGE = False
    importlib.reload(pidispatch_site.urls)
    clear_url_caches()


def test_the_public_edge_serves_only_hooks_and_healthz(client, public_edge, admin_user):
    client.force_login(admin_user)
    assert client.get("/admin/").status_code == 404
    assert client.get("/admin/receiver/delivery/").status_code == 404
    assert client.get("/healthz").status_code == 200
    assert client.get("/hooks/github").status_code == 405  # served (and only POST)


def test_the_private_instance_serves_the_admin(admin_client):
    assert admin_client.get("/admin/receiver/delivery/").status_code == 200


def test_a_github_app_alone_lets_the_self_id_come_from_the_api(bare):
    bare.GITHUB_WEBHOOK_SECRET = "s"
    bare.GITHUB_APP_ID = "123456"  # no GITHUB_TOKEN, no GITHUB_SELF_ID: the App's bot account is looked up
    assert forge_settings().github.self_id == ""
