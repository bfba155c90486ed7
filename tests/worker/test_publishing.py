"""Publishing a completed run (apps/worker/forges/publishing/): the worker pushes the agent's work over smart HTTP to a
real local git remote and opens the pull/merge request through each forge's API on the stand-in forge, or
pushes to the triggering PR's branch, or comments. In process: the clone is a real one (forge_workspace), the
agent's work is files written into it."""

import base64
import codecs
import json
import subprocess
import urllib.parse
from pathlib import Path

import pytest
from django.utils import timezone

from apps.worker.forges.publishing import kept
from apps.worker.forges.publishing import service as publishing
from apps.worker.models import Outcome, Run
from apps.worker.sandbox import container, forge_workspace, jobfiles
from tests.jobspecs import forge_spec
from tests.receiver_support import AZURE_FORK_PROJECT, basic, commit_files, make_repository

AZURE_PROJECT = "068d2409-14eb-4d8a-88bf-c8a9e7f5b4e2"
AZURE_REPOSITORY = "3411ebc1-d5aa-464f-9615-0b527bc66719"
FILES = {"README.md": "hello\n", "src/app.py": "print('hi')\n"}
FINISHED_AT = 1_800_000_000.0  # when the agent's container ended
SUMMARY = "Fix the footer overlap\n\nThe footer now sits below the button."


class Forge:
    """One forge's repository on the stand-in: its API shapes, its git credential, its pull/merge requests."""

    def __init__(self, name, forges, root, *, repo, git_name, credential, spec_fields, register, pull_key):
        self.name, self.forges, self.root, self.repo, self.git_name = name, forges, root, repo, git_name
        self.sha = make_repository(root, git_name, FILES)
        forges.serve_git(root, basic(*credential))
        register(self.sha)
        self.spec_fields = spec_fields
        self.pull_key = pull_key  # how the stand-in keys this repository's pull requests

    @property
    def bare(self) -> Path:
        return self.root / f"{self.git_name}.git"

    @property
    def fork(self) -> str:
        """The deployment's fork of the repository (the stand-in makes it on the first job's request), where jobs
        publish by default."""
        if self.name == "azure":
            return f"{AZURE_FORK_PROJECT}/{self.git_name}"
        return f"pidispatch-bot/{self.repo.split('/')[1]}"

    @property
    def fork_bare(self) -> Path:
        return self.root / f"{self.fork}.git"

    def branches(self, bare: Path | None = None) -> dict[str, str]:
        """The branches of the origin (or of `bare`, the fork's repository)."""
        listing = subprocess.run(["git", "-C", str(bare or self.bare), "for-each-ref",
                                  "--format=%(refname:short) %(objectname)", "refs/heads"],
                                 capture_output=True, text=True, check=True).stdout
        return dict(line.split() for line in listing.splitlines())

    def git(self, *args, bare: Path | None = None) -> str:
        return subprocess.run(["git", "-C", str(bare or self.bare), *args], capture_output=True, text=True,
                              check=True).stdout.strip()

    def spec(self, job_id, **fields):
        return forge_spec(job_id, kind=self.name, **{**self.spec_fields, **fields})

    def pulls(self):
        return self.forges.pulls_of(self.name, self.pull_key)


@pytest.fixture(params=["github", "gitlab", "forgejo", "azure"])
def forge(request, forges, tmp_path, settings):
    settings.PI_PUBLISH_RETRY_SECONDS = 0.01
    root = tmp_path / "remote"
    name = request.param
    if name == "github":
        return Forge(name, forges, root, repo="acme/web", git_name="acme/web",
                     credential=("x-access-token", "ghp-test"), spec_fields={"repo": "acme/web"},
                     register=lambda sha: forges.github_repository("acme/web", sha), pull_key="acme/web")
    if name == "gitlab":
        return Forge(name, forges, root, repo="group/proj", git_name="group/proj", credential=("oauth2", "glpat-test"),
                     spec_fields={"repo": "group/proj", "project_id": "42"},
                     register=lambda sha: forges.gitlab_project(42, "group/proj", sha), pull_key="42")
    if name == "forgejo":
        return Forge(name, forges, root, repo="kostekIV/test", git_name="kostekIV/test",
                     credential=("pidispatch", "forgejo-test-token"), spec_fields={"repo": "kostekIV/test"},
                     register=lambda sha: forges.forgejo_repository("kostekIV/test", sha), pull_key="kostekIV/test")
    azure = Forge(name, forges, root, repo="Fabrikam/widgets", git_name="widgets", credential=("", "azure-pat"),
                  spec_fields={"repo": "Fabrikam/widgets", "project_id": AZURE_PROJECT,
                               "repository_id": AZURE_REPOSITORY},
                  register=lambda sha: forges.azure_repository(AZURE_PROJECT, AZURE_REPOSITORY, "widgets", sha),
                  pull_key=AZURE_REPOSITORY)
    azure.settings = settings  # its fork project is the deployment's setting
    return azure


github_only = pytest.mark.parametrize("forge", ["github"], indirect=True)


def start(tmp_path, spec):
    """The job's folders and its clone, as gate 10 makes them."""
    dirs = jobfiles.prepare(spec, tmp_path / "jobs", owner=container.job_user())
    return dirs, forge_workspace.prepare(spec, dirs, owner=container.job_user())


def publish(spec, dirs, workspace, summary=SUMMARY, **secrets):
    return publishing.publish_run(spec, workspace, dirs.root, dirs.workspace, summary, FINISHED_AT, **secrets)


def comments_posted(forges):
    return [request for request in forges.requests if request["method"] == "POST"
            and ("comments" in request["path"] or "notes" in request["path"] or "threads" in request["path"])]


def test_a_job_without_a_target_title_names_its_pull_request_from_the_summary(tmp_path, forges, settings):
    from apps.worker.forges.publishing import messages

    untitled = forge_spec("job-untitled", number=7, title="")
    assert messages.title(untitled, SUMMARY) == "Fix the footer overlap"
    assert messages.title(untitled, "") == "pi: fix-bug for #7"
    long = forge_spec("job-long", number=7, title="word " * 40)
    assert len(messages.title(long, SUMMARY)) == messages.TITLE_CHARS and messages.title(long, "").endswith("… (#7)")


@pytest.mark.parametrize("publish_to", ["", "origin"])  # "": the deployment's default, through its fork
def test_new_commits_become_one_draft_pull_request_against_the_default_branch(tmp_path, forge, publish_to):
    spec = forge.spec("job-pr", number=7, publish_to=publish_to)
    dirs, workspace = start(tmp_path, spec)
    (dirs.workspace / "src" / "footer.css").write_text("footer { margin-top: 2em; }\n")

    publication, reason = publish(spec, dirs, workspace)

    assert reason == "" and publication.outcome == "published" and publication.pushed_commits == 1
    assert publication.changed_files == 1  # what the run page says the agent changed
    bare = forge.bare if publish_to == "origin" else forge.fork_bare
    assert ("pi/7-fix-bug" in forge.branches()) == (publish_to == "origin")
    head = forge.branches(bare)["pi/7-fix-bug"]
    assert forge.git("rev-parse", f"{head}^", bare=bare) == forge.sha  # on top of the commit the job started from
    assert forge.git("show", f"{head}:src/footer.css", bare=bare) == "footer { margin-top: 2em; }"
    assert forge.git("log", "-1", "--format=%an <%ae>", head, bare=bare) == \
        "pidispatch <pidispatch@users.noreply.localhost>"
    (pull,) = forge.pulls()
    assert (pull["head"], pull["base"], pull["draft"]) == ("pi/7-fix-bug", "main", True)
    assert pull["fork"] == (None if publish_to == "origin" else forge.fork)
    # The title is the issue's own ("A bug", forge_spec's), the agent's summary is the body.
    assert pull["title"].endswith("A bug (#7)") and pull["issues"] == [7]
    assert "Fix the footer overlap" in pull["body"] and "The footer now sits below the button." in pull["body"]
    assert "job-pr" in pull["body"]
    message = forge.git("log", "-1", "--format=%B", head, bare=bare)
    assert message.startswith("A bug (#7)\n\nFix the footer overlap\n\nThe footer now sits below the button.")
    assert publication.pull_request == pull["number"] and publication.url

    # A retried publish step (the worker died after the push, say) finds the one it opened.
    again, _ = publish(spec, dirs, workspace)
    assert again.outcome == "published" and again.pull_request == pull["number"] and len(forge.pulls()) == 1


@github_only
def test_drafts_can_be_turned_off_and_the_body_links_the_run(tmp_path, forge, settings):
    settings.PI_PR_DRAFT, settings.PI_PUBLIC_URL = False, "https://pi.example.com"
    spec = forge.spec("job-ready", number=8)
    dirs, workspace = start(tmp_path, spec)
    (dirs.workspace / "x.txt").write_text("x\n")
    publish(spec, dirs, workspace)
    (pull,) = forge.pulls()
    assert pull["draft"] is False
    assert "https://pi.example.com/admin/worker/run/?job_id=job-ready" in pull["body"]


@pytest.mark.parametrize("forge", ["github", "gitlab"], indirect=True)
def test_no_commits_is_one_comment_with_the_agents_message(tmp_path, forge):
    spec = forge.spec("job-talk", number=7)
    dirs, workspace = start(tmp_path, spec)

    publication, reason = publish(spec, dirs, workspace, summary="I could not reproduce the bug.")

    assert (publication.outcome, reason) == ("commented", "")
    (comment,) = comments_posted(forge.forges)
    assert "I could not reproduce the bug." in str(comment["body"])
    assert forge.pulls() == [] and set(forge.branches()) == {"main"}


@github_only
def test_no_commits_and_no_message_publishes_nothing(tmp_path, forge):
    spec = forge.spec("job-silent", number=7)
    dirs, workspace = start(tmp_path, spec)
    publication, _ = publish(spec, dirs, workspace, summary="")
    assert publication.outcome == "nothing-to-publish" and comments_posted(forge.forges) == []


@github_only
def test_a_long_message_is_cut_to_the_forges_limit_with_a_marker(tmp_path, forge):
    spec = forge.spec("job-long", number=7)
    dirs, workspace = start(tmp_path, spec)
    publish(spec, dirs, workspace, summary="word " * 20000)
    (comment,) = comments_posted(forge.forges)
    text = comment["body"]["body"]
    assert len(text) <= 65536 and "cut" in text and text.rstrip().endswith("`job-long`.")


def pull_request_on_branch(forge, *, fork=None):
    """An open pull request from `feature` (one commit on top of main), as someone opened it."""
    feature_sha = commit_files(forge.bare, {**FILES, "feature.txt": "wip\n"}, branch="feature")
    forge.git("update-ref", "refs/heads/main", forge.sha)
    pull = forge.forges.add_pull_request(forge.name, forge.pull_key, head="feature", sha=feature_sha, fork=fork)
    return pull, feature_sha


def test_a_job_on_a_pull_request_starts_from_its_head_and_pushes_to_its_branch(tmp_path, forge):
    pull, feature_sha = pull_request_on_branch(forge)
    # Publishing to the origin: the pull request's own branch takes the work (through the fork, the next tests).
    spec = forge.spec("job-on-pr", target_type="pull_request", number=pull["number"], publish_to="origin")
    dirs, workspace = start(tmp_path, spec)
    assert (dirs.workspace / "feature.txt").read_text() == "wip\n"  # the PR's head, not the default branch
    (dirs.workspace / "feature.txt").write_text("done\n")

    publication, reason = publish(spec, dirs, workspace)

    assert (publication.outcome, reason, publication.pull_request) == ("published", "", pull["number"])
    head = forge.branches()["feature"]
    assert forge.git("rev-parse", f"{head}^") == feature_sha  # a fast-forward of the PR's own branch
    assert len(forge.pulls()) == 1 and "pi/" not in " ".join(forge.branches())


@github_only
def test_a_pull_request_branch_that_moved_gets_a_comment_never_a_force_push(tmp_path, forge):
    pull, _ = pull_request_on_branch(forge)
    spec = forge.spec("job-moved", target_type="pull_request", number=pull["number"], publish_to="origin")
    dirs, workspace = start(tmp_path, spec)
    (dirs.workspace / "feature.txt").write_text("done\n")
    moved = commit_files(forge.bare, {"other.txt": "someone pushed\n"}, branch="feature")

    publication, reason = publish(spec, dirs, workspace)

    assert (publication.outcome, reason) == ("branch-moved", "")
    assert forge.branches()["feature"] == moved
    assert "moved" in str(comments_posted(forge.forges)[0]["body"])
    assert kept.is_kept(dirs.root)  # the work waits for the operator


def test_a_pull_request_from_a_fork_only_gets_a_comment(tmp_path, forge):
    pull, feature_sha = pull_request_on_branch(forge, fork="someone/fork")
    spec = forge.spec("job-fork", target_type="pull_request", number=pull["number"])
    dirs, workspace = start(tmp_path, spec)
    (dirs.workspace / "feature.txt").write_text("done\n")
    before = forge.branches()

    publication, _ = publish(spec, dirs, workspace)

    assert publication.outcome == "commented" and forge.branches() == before
    assert "fork" in str(comments_posted(forge.forges)[0]["body"])


# --- run.publishTo: fork (issue 46 §2): the agent's branch where the origin's CI gives it no secret ----------------

forking = pytest.mark.parametrize("forge", ["github", "gitlab", "forgejo", "azure"], indirect=True)


@forking
def test_through_the_fork_the_work_is_pushed_there_and_its_pull_request_comes_from_it(tmp_path, forge):
    fork, bare = forge.fork, forge.fork_bare
    spec = forge.spec("job-fork-mode", number=7, publish_to="fork")
    dirs, workspace = start(tmp_path, spec)
    assert workspace.fork.repo == fork  # made before the agent ran
    (dirs.workspace / "src" / "footer.css").write_text("footer { margin-top: 2em; }\n")

    publication, reason = publish(spec, dirs, workspace)

    assert (reason, publication.outcome, publication.pushed_commits) == ("", "published", 1)
    assert "pi/7-fix-bug" not in forge.branches()  # nothing of the agent's in the origin, where CI has secrets
    head = forge.branches(bare)["pi/7-fix-bug"]
    assert forge.git("rev-parse", f"{head}^", bare=bare) == forge.sha
    (pull,) = forge.pulls()
    assert (pull["fork"], pull["head"], pull["base"], pull["sha"]) == (fork, "pi/7-fix-bug", "main", head)
    assert publication.pull_request == pull["number"] and pull["issues"] == [7]

    # A retried publish step finds the one it opened.
    again, _ = publish(spec, dirs, workspace)
    assert again.pull_request == pull["number"] and len(forge.pulls()) == 1


@github_only
def test_the_deployments_default_decides_where_a_trigger_says_nothing(tmp_path, forge, settings):
    _, by_default = start(tmp_path / "a", forge.spec("job-default", number=7))  # the shipped default: the fork
    settings.PI_PUBLISH_TO = "origin"
    _, to_origin = start(tmp_path / "b", forge.spec("job-origin", number=8))
    _, said_fork = start(tmp_path / "c", forge.spec("job-fork", number=9, publish_to="fork"))
    assert (by_default.fork.repo, to_origin.fork, said_fork.fork.repo) == (forge.fork, None, forge.fork)


@forking
def test_a_later_job_uses_the_fork_an_earlier_one_made(tmp_path, forge):
    fork = forge.fork
    _, first = start(tmp_path / "a", forge.spec("job-a", number=7, publish_to="fork"))
    _, second = start(tmp_path / "b", forge.spec("job-b", number=8, publish_to="fork"))
    assert first.fork == second.fork and first.fork.repo == fork


@forking
def test_through_the_fork_a_pull_requests_work_is_a_pull_request_into_its_branch(tmp_path, forge):
    fork = forge.fork
    pull, feature_sha = pull_request_on_branch(forge)
    spec = forge.spec("job-fork-pr", target_type="pull_request", number=pull["number"], publish_to="fork")
    dirs, workspace = start(tmp_path, spec)
    (dirs.workspace / "feature.txt").write_text("done\n")

    publication, reason = publish(spec, dirs, workspace)

    assert (reason, publication.outcome) == ("", "published")
    assert forge.branches()["feature"] == feature_sha  # the pull request's own branch is left as it was
    new = [item for item in forge.pulls() if item["number"] != pull["number"]]
    assert [(item["fork"], item["base"]) for item in new] == [(fork, "feature")]
    assert publication.pull_request == new[0]["number"]


@pytest.mark.parametrize("forge", ["azure"], indirect=True)
def test_a_forge_that_cannot_fork_refuses_the_job_before_it_runs_never_publishing_to_the_origin(tmp_path, forge):
    # Azure DevOps without AZURE_FORK_PROJECT: the deployment has nowhere to fork to.
    forge.settings.AZURE_FORK_PROJECT = ""
    spec = forge.spec("job-no-fork", number=7, publish_to="fork")
    with pytest.raises(publishing.ForgeFailure) as refused:
        start(tmp_path, spec)
    assert (refused.value.reason, refused.value.transient) == ("fork-unavailable", False)
    assert forge.branches() == {"main": forge.sha} and not forge.forges.forks


@pytest.mark.parametrize("forge", ["azure"], indirect=True)
def test_a_repository_of_the_forks_name_that_is_not_its_fork_is_never_pushed_to(tmp_path, forge):
    forge.forges.routes[("POST", f"/{AZURE_FORK_PROJECT}/_apis/git/repositories")] = (409, {
        "message": "TF400948: A Git repository with the name widgets already exists.",
        "typeKey": "GitRepositoryNameAlreadyExistsException"})
    forge.forges.routes[f"/{AZURE_FORK_PROJECT}/_apis/git/repositories/widgets"] = (200, {
        "id": "9e1b6a52-0000-4000-8000-000000000001", "name": "widgets", "isFork": False,
        "remoteUrl": f"{forge.forges.url}/git/{AZURE_FORK_PROJECT}/widgets.git",
        "project": {"id": "9e1b6a52-0000-4000-8000-000000000002", "name": AZURE_FORK_PROJECT}})
    with pytest.raises(publishing.ForgeFailure) as refused:
        start(tmp_path, forge.spec("job-squatted", number=7, publish_to="fork"))
    assert (refused.value.reason, refused.value.transient) == ("fork-unavailable", False)


@github_only
@pytest.mark.parametrize("path, reason", [(".github/workflows/ci.yml", "ci-change-refused"),
                                          (".gitmodules", "submodule-change-refused")])
def test_a_refused_change_is_not_pushed_and_is_kept(tmp_path, forge, path, reason):
    spec = forge.spec("job-ci", number=7)
    dirs, workspace = start(tmp_path, spec)
    target = dirs.workspace / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("x: 1\n")

    publication, refused = publish(spec, dirs, workspace)

    assert (publication.outcome, refused) == (reason, reason)
    assert set(forge.branches()) == {"main"} and forge.pulls() == []
    assert kept.is_kept(dirs.root) and (dirs.root / kept.BUNDLE).exists()


@github_only
def test_the_trigger_may_allow_ci_changes(tmp_path, forge):
    spec = forge.spec("job-ci-ok", number=7, allow_ci_changes=True)
    dirs, workspace = start(tmp_path, spec)
    (dirs.workspace / ".github" / "workflows").mkdir(parents=True)
    (dirs.workspace / ".github" / "workflows" / "ci.yml").write_text("on: push\n")
    assert publish(spec, dirs, workspace)[0].outcome == "published"


@github_only
def test_a_forge_outage_is_retried_then_the_work_is_kept_and_published_again(tmp_path, forge, db, settings):
    spec = forge.spec("job-outage", number=7)
    dirs, workspace = start(tmp_path, spec)
    (dirs.workspace / "fix.txt").write_text("fixed\n")
    pulls = ("POST", "/repos/acme/web/pulls")
    forge.forges.routes[pulls] = (503, {"message": "Service Unavailable"})

    publication, reason = publish(spec, dirs, workspace)

    assert (publication.outcome, reason) == ("publish-unavailable", "publish-unavailable")
    opened = [r for r in forge.forges.requests if r["method"] == "POST" and r["path"] == pulls[1]]
    assert len(opened) == settings.PI_PUBLISH_ATTEMPTS == 6  # the agent not run again
    assert kept.is_kept(dirs.root)

    # The forge is back: the operator's `Publish again` publishes the kept commits.
    del forge.forges.routes[pulls]
    kept.strip_to_kept(dirs.root)
    now = timezone.now()
    run = Run.objects.create(job_id="job-outage", kind="github", started_at=now, ended_at=now,
                             outcome=Outcome.FAILED, reason="publish-unavailable",
                             publish_outcome="publish-unavailable")
    again = publish_again_from(dirs.root, run)
    assert again.outcome == "published" and len(forge.pulls()) == 1
    run.refresh_from_db()
    assert (run.publish_outcome, run.pull_request, run.pushed_commits) == ("published", again.pull_request, 1)
    assert not dirs.root.exists()  # nothing kept once it is out


def publish_again_from(job_root: Path, run):
    from django.test import override_settings

    with override_settings(PI_JOB_ROOT=job_root.parent):
        return kept.publish_again(run)


@github_only
def test_a_forge_refusal_ends_the_publish_as_policy(tmp_path, forge):
    spec = forge.spec("job-403", number=7)
    dirs, workspace = start(tmp_path, spec)
    (dirs.workspace / "fix.txt").write_text("fixed\n")
    forge.forges.routes[("POST", "/repos/acme/web/pulls")] = (
        403, {"message": "Resource not accessible by integration"})

    publication, reason = publish(spec, dirs, workspace)

    assert (publication.outcome, reason) == ("forge-auth-refused", "forge-auth-refused")
    assert kept.is_kept(dirs.root)


@github_only
def test_a_branch_name_another_jobs_work_holds_gets_this_jobs_own(tmp_path, forge):
    commit_files(forge.bare, {"old.txt": "someone's earlier work\n"}, branch="pi/7-fix-bug")
    forge.git("update-ref", "refs/heads/main", forge.sha)
    spec = forge.spec("job-second", number=7)
    dirs, workspace = start(tmp_path, spec)
    (dirs.workspace / "fix.txt").write_text("fixed\n")

    publication, _ = publish(spec, dirs, workspace)

    (pull,) = forge.pulls()
    assert publication.outcome == "published" and pull["head"].startswith("pi/7-fix-bug-")


# --- what is posted holds no secret -------------------------------------------------------------------------

PROVIDER_KEY = "sk-ant-api03-provider-key-0123456789abcdef"
HELD_KEY = {  # the provider key as an agent that reached it might write it into its summary
    "as it is": f"Done. By the way: {PROVIDER_KEY}",
    "base64": "Done.\n\n" + base64.b64encode(f"key={PROVIDER_KEY}".encode()).decode(),
    "hex": "Done. " + PROVIDER_KEY.encode().hex().upper(),
    "url-encoded": "Done. https://x.example/?k=" + urllib.parse.quote(PROVIDER_KEY, safe=""),
    "split": "Done. " + "\n".join(PROVIDER_KEY[i:i + 6] for i in range(0, len(PROVIDER_KEY), 6)),
    # Forms the forge's page shows as the key itself (issue 47 §2), and cheap encodings of it.
    "HTML entities": "Done. " + "".join(f"&#{ord(char)};" for char in PROVIDER_KEY),
    "hex entities": "Done. " + "".join(f"&#x{ord(char):X};" for char in PROVIDER_KEY),
    "markdown escapes": "Done. " + PROVIDER_KEY.replace("-", "\\-"),
    "a comment between its halves": f"Done. {PROVIDER_KEY[:12]}<!-- nothing to see -->{PROVIDER_KEY[12:]}",
    "tags between its parts": f"Done. {PROVIDER_KEY[:8]}<b></b>{PROVIDER_KEY[8:20]}<span>{PROVIDER_KEY[20:]}</span>",
    "emphasis inside it": f"Done. {PROVIDER_KEY[:10]}**{PROVIDER_KEY[10:20]}**{PROVIDER_KEY[20:]}",
    "zero-width spaces": "Done. " + "\u200b".join(PROVIDER_KEY),
    "soft hyphens": "Done. " + "\u00ad".join(PROVIDER_KEY),
    "reversed": "Done. " + PROVIDER_KEY[::-1],
    "rot13": "Done. " + codecs.encode(PROVIDER_KEY, "rot13"),
    "base32": "Done. " + base64.b32encode(f"k={PROVIDER_KEY}".encode()).decode(),
}


@github_only
@pytest.mark.parametrize("how", HELD_KEY)
def test_a_summary_holding_the_provider_key_publishes_nothing_and_keeps_the_work(tmp_path, forge, how):
    spec = forge.spec("job-leak", number=7)
    dirs, workspace = start(tmp_path, spec)
    (dirs.workspace / "fix.txt").write_text("fixed\n")

    publication, reason = publish(spec, dirs, workspace, summary=HELD_KEY[how],
                                  credentials={"ANTHROPIC_API_KEY": PROVIDER_KEY})

    assert (publication.outcome, reason) == ("summary-held-secret", "summary-held-secret")
    assert set(forge.branches()) == {"main"} and forge.pulls() == [] and comments_posted(forge.forges) == []
    assert kept.is_kept(dirs.root)  # for the operator to review; "Publish again" never posts that summary
    description = json.loads((dirs.root / kept.DESCRIPTION).read_text())
    assert description["summary"] == "The agent's summary is not shown: it held a credential of this deployment."


@github_only
def test_a_summary_holding_the_forge_token_posts_no_comment(tmp_path, forge):
    spec = forge.spec("job-token", number=7)
    dirs, workspace = start(tmp_path, spec)
    token = workspace.credential.token

    publication, reason = publish(spec, dirs, workspace, summary="Nothing to change. " + token.encode().hex())

    assert (publication.outcome, reason) == ("summary-held-secret", "summary-held-secret")
    assert comments_posted(forge.forges) == [] and not kept.is_kept(dirs.root)  # no commits: nothing to keep


@github_only
def test_the_jobs_own_secrets_are_scrubbed_from_the_pull_request(tmp_path, forge):
    value = "npm_0123456789abcdefghijklmnop"
    spec = forge.spec("job-scrubbed", number=7)
    dirs, workspace = start(tmp_path, spec)
    (dirs.workspace / "fix.txt").write_text("fixed\n")
    summary = f"Publish with {value}\n\nThe token, once more: {base64.b64encode(value.encode()).decode()}"

    publication, reason = publish(spec, dirs, workspace, summary=summary,
                                  credentials={"ANTHROPIC_API_KEY": PROVIDER_KEY}, job_secrets={"NPM_TOKEN": value})

    assert (publication.outcome, reason) == ("published", "")
    (pull,) = forge.pulls()
    assert "Publish with [scrubbed]" in pull["body"] and "The token, once more: [scrubbed]" in pull["body"]
    assert value not in json.dumps(pull) and base64.b64encode(value.encode()).decode()[:12] not in json.dumps(pull)
    head = forge.branches(forge.fork_bare)["pi/7-fix-bug"]
    assert value not in forge.git("log", "-1", "--format=%B", head, bare=forge.fork_bare)


@github_only
def test_a_job_secret_only_the_forges_page_would_show_is_never_posted(tmp_path, forge):
    """Scrubbing cuts a secret out of the text as written; written as entities, it cannot be cut out."""
    value = "npm_0123456789abcdefghijklmnop"
    spec = forge.spec("job-entities", number=7)
    dirs, workspace = start(tmp_path, spec)
    (dirs.workspace / "fix.txt").write_text("fixed\n")
    summary = "Published with " + "".join(f"&#{ord(char)};" for char in value)

    publication, reason = publish(spec, dirs, workspace, summary=summary, job_secrets={"NPM_TOKEN": value})

    assert (publication.outcome, reason) == ("summary-held-secret", "summary-held-secret")
    assert forge.pulls() == [] and forge.branches(forge.fork_bare) == {"main": forge.sha}


@github_only
@pytest.mark.parametrize("where, written, secret", [
    ("config/settings.py", f"API_KEY = '{PROVIDER_KEY}'\n", "ANTHROPIC_API_KEY"),
    ("docs/notes.md", "key: " + "".join(f"&#{ord(char)};" for char in PROVIDER_KEY) + "\n", "ANTHROPIC_API_KEY"),
    ("notes/b64.txt", base64.b64encode(PROVIDER_KEY.encode()).decode() + "\n", "ANTHROPIC_API_KEY"),
    ("README.md", "Use npm_0123456789abcdefghijklmnop[::-1]: " + "npm_0123456789abcdefghijklmnop"[::-1] + "\n",
     "NPM_TOKEN"),
])
def test_a_file_of_the_work_holding_a_secret_is_never_pushed(tmp_path, forge, where, written, secret):
    spec = forge.spec("job-file-leak", number=7)
    dirs, workspace = start(tmp_path, spec)
    path = dirs.workspace / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(written)

    publication, reason = publish(spec, dirs, workspace, summary="Fixed it.",
                                  credentials={"ANTHROPIC_API_KEY": PROVIDER_KEY},
                                  job_secrets={"NPM_TOKEN": "npm_0123456789abcdefghijklmnop"})

    assert (publication.outcome, reason) == ("secret-in-work", "secret-in-work")
    assert publication.refusal == f"{where} holds {secret}"  # which file and whose name, never the value
    assert PROVIDER_KEY not in publication.refusal
    assert forge.pulls() == [] and forge.branches() == {"main": forge.sha}
    assert forge.branches(forge.fork_bare) == {"main": forge.sha} and kept.is_kept(dirs.root)


@github_only
def test_a_commit_message_holding_the_forge_token_is_never_pushed(tmp_path, forge):
    spec = forge.spec("job-message-leak", number=7)
    dirs, workspace = start(tmp_path, spec)
    token = workspace.credential.token
    (dirs.workspace / "fix.txt").write_text("fixed\n")
    for command in (["add", "fix.txt"], ["-c", "user.name=agent", "-c", "user.email=a@example.invalid", "commit",
                                          "-q", "-m", "Fix\n\ntoken: " + "\u200b".join(token)]):
        subprocess.run(["git", "-c", f"safe.directory={dirs.workspace}", "-C", str(dirs.workspace), *command],
                       check=True, capture_output=True)

    publication, reason = publish(spec, dirs, workspace, summary="Fixed it.")

    assert (publication.outcome, reason) == ("secret-in-work", "secret-in-work")
    assert publication.refusal.startswith("commit ") and publication.refusal.endswith("holds the job's forge token")
    assert forge.pulls() == [] and forge.branches(forge.fork_bare) == {"main": forge.sha}
