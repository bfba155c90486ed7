"""The run page shows the work, and shows it while it happens (issue 30 §2): a real worker runs the demo image with a
sleeping agent while Chromium watches the job's page advance through its phases without a reload, with its output
streaming (capture on, the log permission); the runs list shows it running on top; after a published run against
the stand-in forge the run page shows the paths, commits and diff beside the posted summary; a delivery's status
follows its job. Screenshots are kept under test-results/."""

import json
import subprocess

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from apps.receiver.models import Delivery
from apps.worker.models import Outcome, Run, RunChanges
from tests.conftest import ROOT
from tests.receiver_support import basic, deliver, make_repository

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

OUTPUT = ROOT / "test-results" / "test_run_page_live"
PAT = "ghp-run-page-token"
FILES = {
    "README.md": "# web\n",
    "app/main.py": "print('web')\nprint('old line')\n",
    # What the agent does (fake-agent:run-script; the demo image has no git: the worker commits it), then output
    # the page streams.
    "edit.sh": "printf \"print('web')\\nprint('fixed')\\nprint('more')\\n\" > app/main.py\n"
               "echo 'agent: step one done, thinking about step two'\n",
}


def shot(page, name: str) -> None:
    OUTPUT.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(OUTPUT / f"{name}.png"), full_page=True)


@pytest.fixture
def github(fake_forge, tmp_path):
    """`acme/web` on a local GitHub: protected `main`, cloned and pushed over smart HTTP with the PAT."""
    root = tmp_path / "remote"
    fake_forge.sha = make_repository(root, "acme/web", FILES)
    fake_forge.bare = root / "acme/web.git"
    fake_forge.serve_git(root, basic("x-access-token", PAT))
    fake_forge.github_repository("acme/web", fake_forge.sha)
    fake_forge.env = {"GITHUB_API_URL": fake_forge.url, "GITHUB_TOKEN": PAT}
    return fake_forge


def phases_shown(page) -> list[str]:
    return page.eval_on_selector_all("#job-phases li[data-phase]", "items => items.map(item => item.dataset.phase)")


def test_the_job_page_follows_a_running_job_without_a_reload(
    operator_page, live_server, github, post_github, label_trigger, start_worker
):
    page = operator_page
    job_id = deliver(post_github, "d-live-1", "fake-agent:run-script=edit.sh fake-agent:sleep=6")
    page.goto(f"{live_server.url}{reverse('admin:worker_run_live', args=[job_id])}")
    assert page.text_content("#job-state").strip() == "queued"
    page.evaluate("window.sameDocument = 'never reloaded'")  # gone if the page were loaded again

    start_worker("pi-jobs", env={**github.env, "PI_CAPTURE_JOB_LOGS": "1"})

    # The phases arrive as the worker passes them, each with its time, the container's while it sleeps.
    page.wait_for_function("document.querySelector('#job-phases li[data-phase=container]') !== null",
                           timeout=90_000)
    assert page.text_content("#job-state").strip() == "running"
    shown = phases_shown(page)
    assert shown[:2] == ["queued", "picked-up"] and "workspace" in shown and shown[-1] == "container"
    assert page.eval_on_selector("#job-phases li.current", "item => item.dataset.phase") == "container"
    assert all(page.eval_on_selector_all("#job-phases li time", "times => times.map(time => time.textContent)"))
    # One click to its delivery and its trigger, while it runs.
    delivery = Delivery.objects.get(delivery_id="d-live-1")
    assert page.get_attribute("#job-delivery", "href") == reverse("admin:receiver_delivery_change", args=[delivery.pk])
    assert page.get_attribute("#job-trigger", "href") == reverse("admin:receiver_trigger_change",
                                                                 args=[label_trigger.pk])
    # Its output streams too (capture on, the operator may read logs).
    page.wait_for_function("document.querySelector('#job-output').textContent.includes('step one done')",
                           timeout=20_000)
    shot(page, "job-running")

    # The runs list, meanwhile, has it on top, running.
    beside = page.context.browser.new_context(viewport={"width": 1400, "height": 1000})
    beside.add_cookies(page.context.cookies())  # the same operator, signed in
    runs = beside.new_page()
    runs.goto(f"{live_server.url}{reverse('admin:worker_run_changelist')}")
    row = runs.locator("#running-now tr.running-job")
    assert row.count() == 1 and job_id in row.text_content() and "container running" in row.text_content()
    assert runs.eval_on_selector("#running-now .outcome-running", "node => getComputedStyle(node).backgroundColor") \
        == "rgb(9, 105, 218)"
    shot(runs, "runs-list-running")

    # Then it publishes and is recorded, still without a reload; the page links the record.
    page.wait_for_function("document.getElementById('job-state').textContent === 'completed'", timeout=90_000)
    assert page.evaluate("window.sameDocument") == "never reloaded"
    shown = phases_shown(page)
    assert shown[-2:] == ["publishing", "recorded"]
    # Each step says how long it took: the agent slept 6 s in its container.
    took = page.text_content("#job-phases li[data-phase=container] .took")
    assert took.endswith(" s") and float(took.split()[0]) >= 6, took
    run = Run.objects.get(job_id=job_id)
    assert page.get_attribute("#job-attempts a", "href") == reverse("admin:worker_run_change", args=[run.pk])
    shot(page, "job-completed")

    # Once it ended the runs list shows it in the history, green, and no longer running.
    runs.goto(f"{live_server.url}{reverse('admin:worker_run_changelist')}")
    assert runs.locator("#running-now").count() == 0
    assert runs.eval_on_selector("#result_list .outcome-completed",
                                 "node => getComputedStyle(node).backgroundColor") == "rgb(26, 127, 55)"


def test_a_running_job_is_cancelled_from_its_page_and_the_page_shows_it_end(
    operator_page, live_server, github, post_github, label_trigger, start_worker
):
    page = operator_page
    job_id = deliver(post_github, "d-cancel-1", "fake-agent:sleep=60")
    start_worker("pi-jobs", env=github.env)
    live = f"{live_server.url}{reverse('admin:worker_run_live', args=[job_id])}"
    page.goto(live)
    page.wait_for_function("document.querySelector('#job-phases li[data-phase=container]') !== null",
                           timeout=90_000)

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#job-cancel button")
    page.wait_for_url(live)  # back on the job's page, to watch the cancel land
    page.wait_for_function("['policy', 'cancelled'].includes(document.getElementById('job-state').textContent)",
                           timeout=60_000)
    page.wait_for_selector("#job-attempts a", timeout=30_000)
    assert "operator-cancel" in page.text_content("#job-attempts")
    assert page.locator("#job-cancel").count() == 0  # nothing left to cancel
    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason) == (Outcome.POLICY, "operator-cancel")
    assert (run.ended_at - run.started_at).total_seconds() < 50  # stopped, not slept out
    shot(page, "job-cancelled")


def test_a_published_run_shows_its_paths_commits_and_diff_beside_the_posted_summary(
    operator_page, live_server, github, post_github, label_trigger, run_worker, settings
):
    settings.GITHUB_API_URL = github.url  # the deployment's forge: every page's links are built from it
    github.serve_pages()
    page = operator_page
    job_id = deliver(post_github, "d-diff-1", "fake-agent:run-script=edit.sh fake-agent:say-env=PI_FLOW")
    run_worker("pi-jobs", env_overrides=github.env)

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.publish_outcome) == (Outcome.COMPLETED, "published")
    changes = RunChanges.objects.get(run=run)
    (pull,) = github.pulls_of("github", "acme/web")
    assert changes.source == "pushed" and changes.summary and changes.summary in pull["body"]
    # The commits are the ones pushed to the published branch (of the deployment's fork, where jobs publish).
    published = github.git_root / f"{pull['fork']}.git"
    branch_head = subprocess.run(["git", "--git-dir", str(published), "rev-parse", f"refs/heads/{pull['head']}"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    # The forge's commit carries the title; the record names the worker's commit by what it is instead.
    assert changes.commits == [{"sha": branch_head, "subject": "Changes the agent left uncommitted"}]
    assert subprocess.run(["git", "--git-dir", str(published), "log", "-1", "--format=%s", branch_head],
                          capture_output=True, text=True, check=True).stdout.strip().endswith("(#7)")

    page.goto(f"{live_server.url}{reverse('admin:worker_run_change', args=[run.pk])}")
    files = page.eval_on_selector_all(".run-changes table.changed-files tr", "rows => rows.map(row => row.innerText)")
    assert any(row.split() == ["app/main.py", "+2", "-1"] for row in files), files
    assert any(row.split()[0] == "pi-output.md" and row.split()[1].startswith("+") for row in files), files
    assert page.text_content(".run-changes ol.commits").split() == [branch_head[:12], "Changes", "the", "agent", "left",
                                                                    "uncommitted"]
    diff = page.text_content(".run-changes pre.diff")
    assert "-print('old line')" in diff and "+print('fixed')" in diff and "+# fake pi output" in diff
    assert "Posted on the forge" in page.text_content(".run-changes")
    shot(page, "run-changes")

    # "Published to" leads to the pull request on the forge this deployment is configured with (here the
    # stand-in, not github.com), and that page shows what a reviewer opens: title, branch, commits and the diff.
    pull_page = f"{github.url}/acme/web/pull/{pull['number']}"
    assert page.get_attribute(".field-publish_display a", "href") == pull_page
    assert page.get_attribute(".field-target_display a", "href") == f"{github.url}/acme/web/issues/7"
    page.click(".field-publish_display a")
    page.wait_for_url(pull_page)
    assert page.text_content("h1").strip().startswith(pull["title"])
    assert pull["head"] in page.text_content(".meta")
    assert branch_head[:12] in page.text_content("body")
    shown = page.text_content("pre.diff")
    assert "-print('old line')" in shown and "+print('fixed')" in shown
    shot(page, "published-pull-request")


def test_a_delivery_follows_its_job_to_the_end_and_they_link_both_ways(
    client, post_github, label_trigger, run_worker, settings
):
    job_id = deliver(post_github, "d-state-1", "Please fix it.")
    delivery = Delivery.objects.get(delivery_id="d-state-1")
    admin = User.objects.create_superuser("admin", password="pw")
    client.force_login(admin)
    inbox = client.get(reverse("admin:receiver_delivery_changelist")).content.decode()
    assert "queued → <span class=\"outcome outcome-queued\">queued</span>" in inbox
    assert reverse("admin:worker_run_live", args=[job_id]) in inbox  # not recorded yet: its live page

    run_worker("pi-jobs")

    run = Run.objects.get(job_id=job_id)
    assert delivery.status == Delivery.objects.get(pk=delivery.pk).status == "queued"  # the row is intake's
    inbox = client.get(reverse("admin:receiver_delivery_changelist")).content.decode()
    assert "queued → <span class=\"outcome outcome-completed\">completed</span>" in inbox
    assert f'{reverse("admin:worker_run_changelist")}?job_id={job_id}' in inbox  # one click to its attempts
    page = client.get(reverse("admin:worker_run_change", args=[run.pk])).content.decode()
    assert reverse("admin:receiver_delivery_change", args=[delivery.pk]) in page and "queued → completed" in page
    assert reverse("admin:receiver_trigger_change", args=[label_trigger.pk]) in page  # and its trigger
    assert reverse("admin:worker_run_live", args=[job_id]) in page


def test_the_progress_json_shows_output_only_to_readers_of_run_logs(client, redis_conn):
    from apps.worker.progress.tracker import Progress

    progress = Progress("gh-json-1", host="hostA", attempt=1, redis=redis_conn)
    progress.passed("workspace")
    progress.output("agent output so far")
    url = reverse("admin:worker_run_progress", args=["gh-json-1"])
    assert client.get(url).status_code == 302  # to the admin's login

    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_run"))
    client.force_login(viewer)
    answer = json.loads(client.get(url).content)
    assert [phase["phase"] for phase in answer["progress"]["phases"]] == ["workspace"]
    assert answer["progress"]["host"] == "hostA" and answer["output"] is None

    viewer.user_permissions.add(Permission.objects.get(codename="view_run_log"))
    client.force_login(User.objects.get(pk=viewer.pk))
    assert json.loads(client.get(url).content)["output"] == "agent output so far"
    assert client.get(reverse("admin:worker_run_progress", args=["bad id!"])).status_code == 404

    nobody = User.objects.create_user("nobody", password="pw", is_staff=True)
    client.force_login(nobody)
    assert client.get(url).status_code == 403


def test_a_runs_changes_go_with_its_logs_retention(settings):
    from datetime import timedelta

    from django.utils import timezone

    from apps.worker.forges.publishing import changes as work_changes

    settings.PI_JOB_LOG_RETENTION_DAYS = 14
    now = timezone.now()
    for job_id, age in (("gh-old", 15), ("gh-young", 13)):
        run = Run.objects.create(job_id=job_id, kind="github", started_at=now, ended_at=now, outcome="completed")
        RunChanges.objects.create(run=run, source="pushed", diff=f"{job_id} diff", created_at=now - timedelta(days=age))

    assert work_changes.sweep(now) == 1
    assert list(RunChanges.objects.values_list("run__job_id", flat=True)) == ["gh-young"]


def test_the_diff_is_bounded_small_files_first_and_scrubbed(tmp_path, settings):
    from apps.worker.forges.publishing import changes as work_changes
    from apps.worker.forges.publishing.work import work_between

    settings.PI_RUN_DIFF_MAX_BYTES = 4096
    repo = tmp_path / "repo"

    def git(*args):
        return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid",
                               *args], capture_output=True, text=True, check=True).stdout.strip()

    repo.mkdir()
    git("init", "-q")
    (repo / "small.py").write_text("a = 1\n")
    git("add", "-A")
    git("commit", "-qm", "start")
    start = git("rev-parse", "HEAD")
    (repo / "small.py").write_text("a = 2  # token s3cret-value\n")
    (repo / "big.txt").write_text("".join(f"line {n}\n" for n in range(5000)))
    git("add", "-A")
    git("commit", "-qm", "work with s3cret-value in its message")
    head = git("rev-parse", "HEAD")

    described = work_changes.describe(work_between(repo / ".git", start, head, 1), ["s3cret-value"])

    assert {entry["path"]: (entry["added"], entry["removed"]) for entry in described.files} == {
        "big.txt": (5000, 0), "small.py": (1, 1)}
    assert "+a = 2  # token [scrubbed]" in described.diff and "s3cret-value" not in described.diff
    assert "big.txt" not in described.diff and described.truncated  # the huge file left out, the small one shown
    assert described.commits == [{"sha": head, "subject": "work with [scrubbed] in its message"}]
