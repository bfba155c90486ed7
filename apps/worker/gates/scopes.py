"""The scope grammar shared by pause windows and scoped limits.

A scope names what a rule applies to:
- a bare repository, `owner/name` (GitLab: `group/sub/project`): that repository on every forge;
- a forge-qualified repository, `github:owner/name`: that forge only;
- an absolute folder, `/srv/code/app`: local jobs in that folder (normalised, symlinks not resolved);
- `*`: everything (pause windows only).

A job's candidate scopes, narrowest first: forge jobs `github:owner/name` then `owner/name`; local jobs
their normalised folder.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import unicodedata

from apps.worker.jobs import FORGE_KINDS, JobSpec

EVERYTHING = "*"
_SEGMENT = re.compile(r"^[^\s#:/\x00-\x1f\x7f](?:[^#:/\x00-\x1f\x7f]*[^\s#:/\x00-\x1f\x7f])?$")


class ScopeError(ValueError):
    pass


def normalise_folder(path: str) -> str:
    return unicodedata.normalize("NFC", posixpath.normpath(path))


def _check_repo(repo: str, original: str) -> str:
    segments = repo.split("/")
    if len(segments) < 2 or not all(_SEGMENT.fullmatch(s) and s not in (".", "..") for s in segments):
        raise ScopeError(
            f"{original!r} is not a scope: use owner/repo (GitLab: group/sub/project), a forge-qualified "
            f"repo like github:owner/repo, or an absolute folder path."
        )
    return repo


def parse_scope(raw: str, *, allow_everything: bool) -> str:
    """The canonical form of a scope, or ScopeError saying what is wrong."""
    if not isinstance(raw, str) or not raw or raw != raw.strip():
        raise ScopeError("a scope is a non-empty string without surrounding spaces.")
    if raw == EVERYTHING:
        if not allow_everything:
            raise ScopeError("'*' is not allowed here: a limit names one repository or folder.")
        return raw
    if any(char in raw for char in "*?[]{}"):
        raise ScopeError(f"{raw!r}: globs are not supported; name one repository or folder.")
    if raw.startswith("/"):
        return normalise_folder(raw)
    forge, sep, rest = raw.partition(":")
    if sep:
        if forge not in FORGE_KINDS:
            raise ScopeError(f"{raw!r}: unknown forge prefix {forge!r} (use {', '.join(FORGE_KINDS)}).")
        return f"{forge}:{_check_repo(rest, raw)}"
    return _check_repo(raw, raw)


def bare_repo(scope: str) -> str:
    forge, sep, rest = scope.partition(":")
    return rest if sep and forge in FORGE_KINDS else scope


def job_scopes(spec: JobSpec) -> list[str]:
    if spec.kind == "local":
        return [normalise_folder(spec.folder)]
    return [f"{spec.kind}:{spec.repo}", spec.repo]


def scope_hash(scope: str) -> str:
    """Scopes name repositories and folders; keys and logs carry this hash instead."""
    return hashlib.sha256(scope.encode()).hexdigest()[:16]
