"""A whole job with `run.publishTo: fork` (issue 46 §2): the worker process runs the job's container, then pushes the
agent's work to the deployment's fork on the stand-in GitHub (a real git remote over smart HTTP) and opens the pull
request from there; the origin gets no branch of the agent's, so its CI never runs the agent's code with its secrets."""

import subprocess

import pytest

from apps.worker.models import Outcome, Run
from tests.jobspecs import enqueue_spec, forge_spec
from tests.receiver_support import STAND_IN_TOKEN, github_for_any_repository

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]


def heads(bare) -> set[str]:
    listing = subprocess.run(["git", "-C", str(bare), "for-each-ref", "--format=%(refname:short)", "refs/heads"],
                             capture_output=True, text=True, check=True).stdout
    return set(listing.split())


def test_a_job_that_publishes_through_the_fork_leaves_the_origin_without_a_branch_of_its_own(tmp_path, run_worker):
    forge = github_for_any_repository(tmp_path / "forge", STAND_IN_TOKEN, {"README.md": "A repository.\n"})
    try:
        forge.add_forks("github", "acme/web")
        spec = forge_spec("gh-through-fork", body="fake-agent:write-mb=1 Please fix it.", secrets_profile="",
                          publish_to="fork")
        enqueue_spec(spec)

        run_worker("pi-jobs", env_overrides={"GITHUB_API_URL": forge.url})

        run = Run.objects.get(job_id=spec.job_id)
        assert (run.outcome, run.reason, run.publish_outcome) == (Outcome.COMPLETED, "", "published")
        (pull,) = forge.pulls_of("github", "acme/web")
        assert (pull["fork"], pull["head"], pull["base"]) == ("pidispatch-bot/web", "pi/7-fix-bug", "main")
        assert heads(tmp_path / "forge" / "any.git") == {"main"}  # the origin: nothing of the agent's
        assert "pi/7-fix-bug" in heads(tmp_path / "forge" / "pidispatch-bot" / "web.git")
    finally:
        forge.close()


def test_a_job_that_publishes_through_the_fork_on_a_forge_that_cannot_is_refused_before_it_runs(
        tmp_path, run_worker, job_containers):
    forge = github_for_any_repository(tmp_path / "forge", STAND_IN_TOKEN, {"README.md": "A repository.\n"})
    try:
        # GitHub's answer where forking is off for the organization or the token may not fork.
        forge.routes[("POST", "/repos/acme/web/forks")] = (403, {"message": "Forking is disabled"})
        spec = forge_spec("gh-no-fork", body="fake-agent:write-mb=1", secrets_profile="", publish_to="fork")
        enqueue_spec(spec)

        run_worker("pi-jobs", env_overrides={"GITHUB_API_URL": forge.url})

        run = Run.objects.get(job_id=spec.job_id)
        assert (run.outcome, run.reason, run.budget_reserved) == (Outcome.POLICY, "fork-unavailable", False)
        assert heads(tmp_path / "forge" / "any.git") == {"main"} and forge.pulls_of("github", "acme/web") == []
    finally:
        forge.close()
