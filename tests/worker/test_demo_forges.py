"""What `make run` lets a person try with the other forges, end to end: `send_delivery` posts a labelled GitLab issue
(Forgejo, Azure DevOps work item) to the live server, a real worker runs the demo image on a clone from `make run`'s
stand-in (devtools/fake_forge.py `forges_for_any_repository`), publishes the agent's work there as a merge/pull
request, and the stand-in's page for it shows the branch, the commit and the diff."""

import io
import re
import urllib.request

import pytest
from django.core.management import call_command

from apps.receiver.sample_deliveries import job_state
from devtools.fake_forge import AZURE_FORK_PROJECT, forges_for_any_repository
from devtools.stack import DEMO_REPOSITORY
from tests.receiver_support import rule

TOKENS = {"github": "gh-demo", "gitlab": "gl-demo", "forgejo": "fj-demo", "azure": "az-demo"}
AZURE_SELF = "0f0f0f0f-1111-2222-3333-444444444444"


@pytest.fixture
def stand_in(settings, tmp_path, worker_env):
    from apps.worker.forges.base import ForgeClient

    ForgeClient.authority_cache.clear()
    server = forges_for_any_repository(tmp_path / "forge", TOKENS, DEMO_REPOSITORY)
    forge_settings = {
        "GITHUB_API_URL": server.url, "GITHUB_TOKEN": TOKENS["github"],
        "GITLAB_URL": server.url, "GITLAB_TOKEN": TOKENS["gitlab"], "GITLAB_WEBHOOK_MODE": "token",
        "GITLAB_WEBHOOK_SECRET": "gitlab-secret", "GITLAB_SELF_ID": "1",
        "FORGEJO_URL": server.url, "FORGEJO_TOKEN": TOKENS["forgejo"], "FORGEJO_WEBHOOK_SECRET": "forgejo-secret",
        "FORGEJO_SELF_ID": "1",
        "AZURE_ORG_URL": server.url, "AZURE_TOKEN": TOKENS["azure"], "AZURE_WEBHOOK_MODE": "basic",
        "AZURE_WEBHOOK_SECRET": "pidispatch:azure-secret", "AZURE_SELF_ID": AZURE_SELF,
        "AZURE_FORK_PROJECT": AZURE_FORK_PROJECT,
    }
    for name, value in forge_settings.items():
        setattr(settings, name, value)
    worker_env.update(forge_settings)
    yield server
    server.close()
    ForgeClient.authority_cache.clear()


def page(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"] == "text/html; charset=utf-8"
        return response.read().decode()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("forge, page_path", [
    ("gitlab", "acme/shop/storefront/-/merge_requests/{n}"),
    ("forgejo", "acme/web/pulls/{n}"),
    ("azure", "Fabrikam-Fiber-Git/_git/web/pullrequest/{n}"),
])
def test_a_labelled_issue_becomes_a_merge_request_on_the_stand_in(forge, page_path, stand_in, live_server,
                                                                   run_worker):
    from apps.worker.models import Run

    rule(position=0, kind=forge, on_type="label", label_any=["pi"], flow="demo",
         repository="web" if forge == "azure" else "")
    out = io.StringIO()
    call_command("send_delivery", forge=forge, label="pi", number=31, url=live_server.url, stdout=out, wait=0)
    job_id = re.search(r"^queued: (\S+)$", out.getvalue(), re.MULTILINE).group(1)

    run_worker("pi-jobs")

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.publish_outcome) == ("completed", "published"), (run.reason, run.publish_reason)
    (request,) = stand_in.created_pull_requests
    assert (request["forge"], request["base"], request["number"]) == (forge, "main", run.pull_request)
    assert request["head"].startswith("pi/31")
    shown = page(f"{stand_in.url}/{page_path.format(n=run.pull_request)}")
    # The page a reviewer opens: the branch, the agent's commit and its diff.
    assert request["head"] in shown and "pi-output.md" in shown and 'class=add' in shown, shown


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("forge, action", [("github", "labeled"), ("gitlab", "update"), ("forgejo", "label_updated"),
                                           ("azure", "created")])
def test_a_pull_request_sample_of_each_forge_runs_to_a_completed_run(forge, action, stand_in, live_server,
                                                                     run_worker):
    """The stand-in opens the pull/merge request a sample names when the worker first asks for it (its head branch
    and commit in the served repository), so the sample ends as a completed run, not `pull-request-missing`;
    `send_delivery` follows the job and prints the run's outcome and page."""
    from apps.worker.models import Run

    rule(position=0, kind=forge, on_type="pull_request", actions=[action],
         label_any=[] if forge == "azure" else ["pi"], flow="demo")
    out = io.StringIO()
    call_command("send_delivery", forge=forge, event="pull_request", label="pi", number=57, url=live_server.url,
                 stdout=out, wait=0)
    job_id = re.search(r"^queued: (\S+)$", out.getvalue(), re.MULTILINE).group(1)

    run_worker("pi-jobs")

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason) == ("completed", ""), (run.reason, run.forge_message)
    (opened,) = [pr for pr in stand_in.pull_requests if not pr["created"]]
    assert (opened["number"], opened["head"]) == (57, "sample/57")
    line, ended = job_state(job_id, live_server.url)  # what send_delivery prints when it follows the job
    assert ended and line == f"{job_id}: completed, {run.publish_outcome}" + (
        f" {run.publish_url}" if run.publish_url else "") + f": {live_server.url}/admin/worker/run/{run.pk}/change/"
