"""What the worker refuses to push, checked on the agent's work before anything leaves the host.

Each refusal is a reason token recorded on the run, with a fixed sentence on the issue (comments.py); the
work itself is kept (a bundle under the job's folder) so an operator can look and publish it by hand.

    ci-change-refused         CI definitions changed and the trigger does not allow it (`run.allowCiChanges`)
    push-too-many-files       more than PI_MAX_CHANGED_FILES paths changed
    push-too-large            the new content is more than PI_MAX_PUSH_BYTES
    file-too-large            one file is over the forge's own limit
    symlink-escapes           a link that leads outside the repository (or anywhere absolute), followed as a
                              checkout would follow it, through the tree's other links
    submodule-change-refused  a submodule or .gitmodules added, changed or removed
"""

from __future__ import annotations

from django.conf import settings

from apps.worker.forges.publishing.work import GITLINK_MODE, Work

# The kernel's own bound on links followed in one lookup.
MAX_LINK_HOPS = 40
CI_PATHS = (".github/workflows/", ".gitlab-ci.yml", ".forgejo/workflows/", ".gitea/workflows/",
            "azure-pipelines.yml", ".azure-pipelines/", ".gitlab/ci/")


def is_ci_definition(path: str) -> bool:
    return any(path.startswith(prefix) if prefix.endswith("/") else path == prefix for prefix in CI_PATHS)


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


def refusal(work: Work, *, allow_ci_changes: bool, max_file_bytes: int) -> str | None:
    """The first reason this work may not be pushed, or None."""
    changes = work.changes
    if any(change.new_mode == GITLINK_MODE or change.old_mode == GITLINK_MODE or change.path == ".gitmodules"
           for change in changes):
        return "submodule-change-refused"
    if not allow_ci_changes and any(is_ci_definition(change.path) for change in changes):
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
