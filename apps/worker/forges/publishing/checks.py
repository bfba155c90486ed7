"""What the worker refuses to push, checked on the agent's work before anything leaves the host.

Each refusal is a reason token recorded on the run, with a fixed sentence on the issue (comments.py); the
work itself is kept (a bundle under the job's folder) so an operator can look and publish it by hand.

    ci-change-refused         CI definitions changed and the trigger does not allow it (`run.allowCiChanges`):
                              every CI system's pipeline files (CI_PATHS), local actions and Jenkinsfiles anywhere,
                              every file of the repository the GitLab pipeline at the work's head includes
                              (gitlab_ci_files), and any YAML file where the pipeline's file cannot be judged
    push-too-many-files       more than PI_MAX_CHANGED_FILES paths changed
    push-too-large            the new content is more than PI_MAX_PUSH_BYTES
    file-too-large            one file is over the forge's own limit
    symlink-escapes           a link that leads outside the repository (or anywhere absolute), followed as a
                              checkout would follow it, through the tree's other links
    submodule-change-refused  a submodule or .gitmodules added, changed or removed
"""

from __future__ import annotations

import fnmatch
import re

import yaml
from django.conf import settings

from apps.worker.forges.publishing.work import GITLINK_MODE, Work, WorkUnreadable, git

# The kernel's own bound on links followed in one lookup.
MAX_LINK_HOPS = 40
# Defence in depth only: whatever a CI system runs (a Makefile, package.json's scripts, a script a workflow calls) is
# code the agent can change, which no list closes; publishing from a fork keeps the origin's secrets from it. What is
# listed is every CI system's own definitions, so that a change to them is never pushed unasked.
CI_PATHS = (
    ".github/workflows/", ".github/actions/", ".gitlab-ci.yml", ".gitlab/ci/", ".forgejo/workflows/",
    ".forgejo/actions/", ".gitea/workflows/", ".gitea/actions/", "azure-pipelines.yml", "azure-pipelines.yaml",
    ".azure-pipelines/", ".azuredevops/", ".circleci/", ".buildkite/", ".drone.yml", ".drone.yaml", ".drone.star",
    ".woodpecker.yml", ".woodpecker.yaml", ".woodpecker/", ".travis.yml", "bitbucket-pipelines.yml", ".semaphore/",
    "appveyor.yml", ".appveyor.yml", ".cirrus.yml", ".cirrus.star", "buildspec.yml", "cloudbuild.yaml",
    "cloudbuild.yml", "codefresh.yml", ".teamcity/", ".tekton/", ".harness/", "bitrise.yml", ".gitpod.yml",
    ".devcontainer/",
)
# Wherever they are: a Jenkins job names its pipeline's script path, and a workflow uses a local action from any
# folder (`uses: ./tools/setup`).
CI_FILE_NAMES = ("action.yml", "action.yaml")
CI_FILE_PREFIXES = ("Jenkinsfile",)
# Forges whose pipeline may be any YAML file of the repository, named by a setting the worker does not read: an
# Azure DevOps pipeline names its YAML file; a GitLab project may set a custom CI path (judged so only when the
# repository has no .gitlab-ci.yml, whose includes are read otherwise).
ANY_YAML_FORGES = ("azure",)
GITLAB_CI = ".gitlab-ci.yml"
# How much of the pipeline is read to find its includes; past it, every YAML file counts as CI.
GITLAB_CI_MAX_FILES, GITLAB_CI_MAX_BYTES = 100, 1024 * 1024
VARIABLE = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")
YAML_FILE = ("*.yml", "*.yaml")


def is_ci_definition(path: str) -> bool:
    name = path.rpartition("/")[2]
    return (any(path.startswith(prefix) if prefix.endswith("/") else path == prefix for prefix in CI_PATHS)
            or name in CI_FILE_NAMES or name.startswith(CI_FILE_PREFIXES))


class _PipelineLoader(yaml.SafeLoader):
    """YAML as GitLab writes it: its own tags (`!reference [...]`) read as the plain values they tag."""


def _untagged(loader, suffix, node):
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    return loader.construct_scalar(node)


_PipelineLoader.add_multi_constructor("!", _untagged)


def _local_includes(entry, repository: str) -> list[str]:
    """The repository's own files an `include:` names: a string that is no URL, `local:`, and `project:` + `file:`
    when the project is this repository."""
    if isinstance(entry, str):
        return [] if "://" in entry else [entry]
    if isinstance(entry, list):
        return [path for item in entry for path in _local_includes(item, repository)]
    if not isinstance(entry, dict):
        return []
    if isinstance(entry.get("local"), str):
        return [entry["local"]]
    project, files = entry.get("project"), entry.get("file")
    if isinstance(project, str) and repository and project.strip("/").lower() == repository.lower():
        return [path for path in (files if isinstance(files, list) else [files]) if isinstance(path, str)]
    return []


def _includes_of(document, repository: str) -> list[str]:
    """A pipeline file's includes, and those of the child pipelines its jobs trigger, as patterns from the root
    (a variable in one matches anything)."""
    if not isinstance(document, dict):
        return []
    named = _local_includes(document.get("include"), repository)
    for job in document.values():
        if isinstance(job, dict) and isinstance(job.get("trigger"), dict):
            named += _local_includes(job["trigger"].get("include"), repository)
    return [VARIABLE.sub("*", path.strip()).lstrip("/") for path in named if path.strip()]


def _pipeline_file(work: Work, path: str):
    """The parsed file at the work's head; None when it is not there; ValueError when it cannot be read."""
    size = git(work.store, "cat-file", "-s", f"{work.head}:{path}", check=False)
    if size.returncode != 0:
        return None
    if int(size.stdout.strip() or 0) > GITLAB_CI_MAX_BYTES:
        raise ValueError(f"{path} is too large to read")
    text = git(work.store, "cat-file", "blob", f"{work.head}:{path}").stdout
    try:
        return yaml.load(text, Loader=_PipelineLoader)  # a SafeLoader: builds plain values only
    except yaml.YAMLError:
        raise ValueError(f"{path} is not YAML") from None


def _holds(work: Work, path: str) -> bool:
    return git(work.store, "cat-file", "-e", f"{work.head}:{path}", check=False).returncode == 0


def gitlab_ci_files(work: Work, repository: str = "") -> tuple[str, ...] | None:
    """Patterns of the repository's files the GitLab pipeline at the work's head reads: what `.gitlab-ci.yml`
    includes, what those include in turn, and the child pipelines' files. () without a `.gitlab-ci.yml`; None when
    the pipeline could not be read to the end (then any YAML file may be one of them)."""
    try:
        root = _pipeline_file(work, GITLAB_CI)
        if root is None:
            return ()
        tree = git(work.store, "ls-tree", "-r", "-z", "--name-only", work.head).stdout.split("\0")
        patterns, queue, read = [], [root], {GITLAB_CI}
        while queue:
            for pattern in _includes_of(queue.pop(), repository):
                patterns.append(pattern)
                for path in (path for path in tree if path not in read and fnmatch.fnmatchcase(path, pattern)):
                    if len(read) >= GITLAB_CI_MAX_FILES:
                        return None
                    read.add(path)
                    queue.append(_pipeline_file(work, path))
    except (ValueError, WorkUnreadable):
        return None
    return tuple(patterns)


def _changes_pipeline_files(work: Work, repository: str, forge: str) -> bool:
    """Whether the work changes a file the forge's pipeline may read: what the GitLab pipeline includes, or any
    YAML file where that cannot be judged (an unreadable pipeline, a forge whose pipeline file is a setting)."""
    patterns = gitlab_ci_files(work, repository)
    if patterns is None or forge in ANY_YAML_FORGES or (forge == "gitlab" and not _holds(work, GITLAB_CI)):
        patterns = YAML_FILE
    return any(fnmatch.fnmatchcase(change.path, pattern) for change in work.changes for pattern in patterns)


def link_escapes(path: str, links: dict[str, str]) -> bool:
    """Whether the link at `path` leads outside the repository once followed as a checkout's kernel would follow
    it, through the tree's other links (`links`: path -> target): `sub/deep -> ..` stays inside, and so does
    `up -> sub/deep/..` read alone, yet together `up` is the checkout's parent. A part that is no link is taken
    as written; a chain longer than the kernel follows counts as leaving."""
    at = path.split("/")[:-1]  # the folder the link is in
    pending, hops = _parts(links[path]), 1
    if pending is None:
        return True
    while pending:
        part = pending.pop(0)
        if part == "..":
            if not at:
                return True
            at.pop()
        elif "/".join([*at, part]) not in links:
            at.append(part)
        else:
            hops += 1
            more = _parts(links["/".join([*at, part])])
            if more is None or hops > MAX_LINK_HOPS:
                return True
            pending = more + pending
    return False


def _parts(target: str) -> list[str] | None:
    """A link target's parts; None for a target that leaves by itself (absolute, empty, a NUL in it)."""
    if not target or target.startswith("/") or "\0" in target:
        return None
    return [part for part in target.split("/") if part not in ("", ".")]


def _escaping(links: dict[str, str]) -> set[tuple[str, str]]:
    return {(path, target) for path, target in links.items() if link_escapes(path, links)}


def refusal(work: Work, *, allow_ci_changes: bool, max_file_bytes: int, repository: str = "",
            forge: str = "") -> str | None:
    """The first reason this work may not be pushed, or None. `repository` is the forge's name of it (a GitLab
    include of this project's own file is local); `forge` its kind (github, gitlab, forgejo, azure)."""
    changes = work.changes
    if any(change.new_mode == GITLINK_MODE or change.old_mode == GITLINK_MODE or change.path == ".gitmodules"
           for change in changes):
        return "submodule-change-refused"
    if not allow_ci_changes and (any(is_ci_definition(change.path) for change in changes)
                                 or _changes_pipeline_files(work, repository, forge)):
        return "ci-change-refused"
    if _escaping(work.links) - _escaping(work.start_links):  # a link the repository had already is not the agent's
        return "symlink-escapes"
    if len(changes) > settings.PI_MAX_CHANGED_FILES:
        return "push-too-many-files"
    if any(change.size > max_file_bytes for change in changes):
        return "file-too-large"
    if sum(change.size for change in changes) > settings.PI_MAX_PUSH_BYTES:
        return "push-too-large"
    return None
