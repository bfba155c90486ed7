"""The demo's stand-in forge shows people what a reviewer opens: each issue and pull/merge request as a page (title,
body, branch, commits, the diff) at the forges' own paths, with hostile issue text shown as text, never run. In
Chromium; screenshots under test-results/. And the private server's root leads to the admin, which links the API's
docs."""

import importlib
from pathlib import Path

import pytest
from django.urls import clear_url_caches, set_urlconf

from devtools.fake_forge import forges_for_any_repository, git

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = ROOT / "test-results" / "test_stand_in_pages"
TOKENS = {"github": "gh", "gitlab": "gl", "forgejo": "fj", "azure": "az"}
HOSTILE_TITLE = "<script>document.title='pwned'</script>Checkout & footer"
HOSTILE_BODY = '<img src=x onerror="document.body.dataset.pwned=1"> the footer\nFixes #7'


@pytest.fixture
def stand_in(tmp_path):
    server = forges_for_any_repository(tmp_path / "forge", TOKENS, {"README.md": "# acme/web\n"})
    yield server
    server.close()


def push_branch(root: Path, branch: str, path: str, text: str) -> str:
    """A commit on top of main, pushed to `branch` of the stand-in's repository, as the worker publishes one."""
    work = root / f"work-{branch.replace('/', '-')}"
    git(root, "clone", "-q", str(root / "any.git"), str(work))
    (work / path).write_text(text)
    git(work, "add", path)
    git(work, "commit", "-q", "-m", "pi: notes on the checkout <b>button</b>")
    git(work, "push", "-q", "origin", f"HEAD:refs/heads/{branch}")
    return git(work, "rev-parse", "HEAD")


def test_a_pull_request_page_shows_branch_commits_and_diff_and_runs_nothing(stand_in, browser_page, tmp_path):
    sha = push_branch(tmp_path / "forge", "pi/7-demo", "NOTES.md", "The button <overlaps> the footer.\n")
    pull = stand_in.add_pull_request("github", "acme/web", head="pi/7-demo", sha=sha, title=HOSTILE_TITLE,
                                     body=HOSTILE_BODY)
    stand_in.add_issue("github", "acme/web", 7, title=HOSTILE_TITLE, body=HOSTILE_BODY)
    OUTPUT.mkdir(parents=True, exist_ok=True)

    page = browser_page
    response = page.goto(f"{stand_in.url}/acme/web/pull/{pull['number']}")
    assert response.status == 200
    page.screenshot(path=str(OUTPUT / "pull-request.png"), full_page=True)
    assert page.title() == f"{HOSTILE_TITLE} (pull request #{pull['number']})"  # shown as text, not run
    assert page.evaluate("document.querySelectorAll('script, img').length") == 0
    assert page.evaluate("document.body.dataset.pwned") is None
    text = page.inner_text("body")
    assert "pi/7-demo into main" in text and HOSTILE_BODY.splitlines()[0] in text and "closes #7" in text
    assert "pi: notes on the checkout <b>button</b>" in page.inner_text("ul.commits")
    assert page.inner_text("pre.diff span.add >> nth=-1") == "+The button <overlaps> the footer."

    response = page.goto(f"{stand_in.url}/acme/web/issues/7")
    assert response.status == 200
    page.screenshot(path=str(OUTPUT / "issue.png"), full_page=True)
    assert page.title() == f"{HOSTILE_TITLE} (#7)"
    assert page.evaluate("document.querySelectorAll('script, img').length") == 0
    assert f"#{pull['number']} {HOSTILE_TITLE}" in page.inner_text("body")  # the pull request that closes it


def test_gitlab_and_azure_pages_at_their_own_paths(stand_in, browser_page, tmp_path):
    sha = push_branch(tmp_path / "forge", "pi/9-demo", "NOTES.md", "notes\n")
    merge_request = stand_in.add_pull_request("gitlab", "4711", head="pi/9-demo", sha=sha, title="Draft: notes")
    pull = stand_in.add_pull_request("azure", "web", head="pi/9-demo", sha=sha, title="notes for the work item")

    page = browser_page
    page.goto(f"{stand_in.url}/acme/shop/storefront/-/merge_requests/{merge_request['number']}")
    page.screenshot(path=str(OUTPUT / "merge-request.png"), full_page=True)
    assert page.title() == f"Draft: notes (merge request #{merge_request['number']})"
    assert "+notes" in page.inner_text("pre.diff")
    page.goto(f"{stand_in.url}/Fabrikam/_git/web/pullrequest/{pull['number']}")
    assert page.title() == f"notes for the work item (pull request #{pull['number']})"

    response = page.goto(f"{stand_in.url}/acme/web/pull/999")
    assert response.status == 404 and page.title() == "No pull request #999"


def test_the_private_servers_root_leads_to_the_admin_which_links_the_api_docs(client, admin_user):
    response = client.get("/")
    assert (response.status_code, response["Location"]) == (302, "/admin/")
    client.force_login(admin_user)
    home = client.get("/admin/").content.decode()
    assert '<a href="/api/v1/docs/" id="link-api-docs">API docs</a>' in home
    assert client.get("/api/v1/docs/").status_code == 200


def test_the_public_edge_has_no_home(settings, client):
    import pidispatch_site.urls as urls

    settings.PI_PUBLIC_EDGE = True
    try:
        importlib.reload(urls)
        clear_url_caches()
        assert client.get("/").status_code == 404  # the edge serves the hooks and the health check alone
    finally:
        settings.PI_PUBLIC_EDGE = False
        importlib.reload(urls)
        clear_url_caches()
        set_urlconf(None)
