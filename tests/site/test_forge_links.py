"""Every link to a forge's issue or pull request is built in one place, the forge registry, from the web root this
deployment is configured with: the run page, the runs list and the fleet panel link the forge the deployment talks to
(the stand-in forge in the demo, an Enterprise or self-hosted host), never the address a stand-in's answer named."""

import pytest
from django.utils import timezone

from apps import forge_registry
from apps.worker.models import Run
from tests.fleet_support import PANEL


@pytest.mark.parametrize("api_url, web_url, root", [
    ("https://api.github.com", "", "https://github.com"),
    ("https://ghe.example.com/api/v3", "", "https://ghe.example.com"),  # GitHub Enterprise Server
    ("http://127.0.0.1:8765", "", "http://127.0.0.1:8765"),  # the stand-in forge: pages where its API is
    ("https://api.github.com", "https://github.example.net/", "https://github.example.net"),  # said outright
])
def test_githubs_web_root_comes_from_its_api_url_unless_set(settings, api_url, web_url, root):
    settings.GITHUB_API_URL, settings.GITHUB_WEB_URL = api_url, web_url
    assert forge_registry.web_root("github") == root
    assert forge_registry.pull_url("github", "acme/web", 41) == f"{root}/acme/web/pull/41"
    assert forge_registry.target_url("github", "acme/web#7") == f"{root}/acme/web/issues/7"


def test_each_forge_links_its_own_pages(settings):
    settings.GITLAB_URL, settings.GITLAB_WEB_URL = "https://gitlab.example.com", ""
    settings.FORGEJO_URL, settings.FORGEJO_WEB_URL = "https://codeberg.org", ""
    settings.AZURE_ORG_URL, settings.AZURE_WEB_URL = "https://dev.azure.com/fabrikam", "https://tfs.example.com/coll"

    assert forge_registry.target_url("gitlab", "group/sub/proj#3") == \
        "https://gitlab.example.com/group/sub/proj/-/issues/3"
    assert forge_registry.target_url("gitlab", "group/sub/proj!4") == \
        "https://gitlab.example.com/group/sub/proj/-/merge_requests/4"
    assert forge_registry.target_url("forgejo", "kostekIV/test#5") == "https://codeberg.org/kostekIV/test/issues/5"
    assert forge_registry.pull_url("forgejo", "kostekIV/test", 6) == "https://codeberg.org/kostekIV/test/pulls/6"
    assert forge_registry.target_url("azure", "Fabrikam Web/web#7") == \
        "https://tfs.example.com/coll/Fabrikam%20Web/_workitems/edit/7"
    assert forge_registry.target_url("azure", "Fabrikam/web!8") == \
        "https://tfs.example.com/coll/Fabrikam/_git/web/pullrequest/8"


@pytest.mark.parametrize("target", ["", "acme/web", "acme/web#x", "local:app", "acme/web#7?x", "acme/web!"])
def test_a_target_no_page_is_known_for_links_nowhere(settings, target):
    assert forge_registry.target_url("github", target) == ""
    assert forge_registry.target_url("bitbucket", "acme/web#7") == ""


@pytest.mark.django_db(transaction=True)
def test_the_pages_link_the_configured_forge_not_the_address_a_stand_in_answered(admin_client, settings, redis_conn):
    stand_in = "http://127.0.0.1:8765"
    settings.GITHUB_API_URL, settings.GITHUB_WEB_URL = stand_in, ""
    now = timezone.now()
    # What the demo recorded: the stand-in answered the create with github.com's address of a stranger's repository.
    run = Run.objects.create(job_id="gh-demo-1", kind="github", target="demo/app#7", started_at=now, ended_at=now,
                             outcome="completed", publish_outcome="published", pull_request=41,
                             publish_url="https://github.com/acme/web/pull/41")

    pages = {"run page": admin_client.get(f"/admin/worker/run/{run.pk}/change/").content.decode(),
             "runs list": admin_client.get("/admin/worker/run/").content.decode(),
             "fleet panel": admin_client.get(PANEL).content.decode().split('id="fleet-published"')[1]}

    for name, page in pages.items():
        assert f'href="{stand_in}/demo/app/pull/41"' in page, name
        assert "github.com/acme/web" not in page, name
    assert f'href="{stand_in}/demo/app/issues/7"' in pages["run page"]
    assert f'href="{stand_in}/demo/app/issues/7"' in pages["fleet panel"]
