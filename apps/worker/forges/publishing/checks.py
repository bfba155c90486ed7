"""What the worker refuses to push, checked on the agent's work before anything leaves the host.

Each refusal is a reason token recorded on the run, with a fixed sentence on the issue (comments.py); the
work itself is kept (a bundle under the job's folder) so an operator can look and publish it by hand.

    ci-change-refused         CI definitions changed and the trigger does not allow it (`run.allowCiChanges`)
    push-too-many-files       more than PI_MAX_CHANGED_FILES paths changed
    push-too-large            the new content is more than PI_MAX_PUSH_BYTES
    file-too-large            one file is over the forge's own limit
    symlink-escapes           a link that points outside the repository (or anywhere absolute)
    submodule-change-refused  a submodule or .gitmodules added, changed or removed
"""

from __future__ import annotations

import posixpath

from django.conf import settings

from apps.worker.forges.publishing.work import GITLINK_MODE, SYMLINK_MODE, Work

CI_PATHS = (".github/workflows/", ".gitlab-ci.yml", ".forgejo/workflows/", ".gitea/workflows/",
            "azure-pipelines.yml", ".azure-pipelines/", ".gitlab/ci/")


def is_ci_definition(path: str) -> bool:
    return any(path.startswith(prefix) if prefix.endswith("/") else path == prefix for prefix in CI_PATHS)


def symlink_escapes(path: str, target: str) -> bool:
    if not target or target.startswith("/") or "\0" in target:
        return True
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    return resolved == ".." or resolved.startswith("../")


def refusal(work: Work, *, allow_ci_changes: bool, max_file_bytes: int) -> str | None:
    """The first reason this work may not be pushed, or None."""
    changes = work.changes
    if any(change.new_mode == GITLINK_MODE or change.old_mode == GITLINK_MODE or change.path == ".gitmodules"
           for change in changes):
        return "submodule-change-refused"
    if not allow_ci_changes and any(is_ci_definition(change.path) for change in changes):
        return "ci-change-refused"
    if any(change.new_mode == SYMLINK_MODE and symlink_escapes(change.path, change.symlink_target)
           for change in changes):
        return "symlink-escapes"
    if len(changes) > settings.PI_MAX_CHANGED_FILES:
        return "push-too-many-files"
    if any(change.size > max_file_bytes for change in changes):
        return "file-too-large"
    if sum(change.size for change in changes) > settings.PI_MAX_PUSH_BYTES:
        return "push-too-large"
    return None
