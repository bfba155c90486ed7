"""The scope grammar shared by pause windows and scoped limits.

A scope names what a rule applies to:
- a bare repository, `owner/name` (GitLab: `group/sub/project`): that repository on every forge;
- a forge-qualified repository, `github:owner/name`: that forge only;
- an absolute folder, `/srv/code/app`: local jobs in that folder (normalised, symlinks not resolved);
- `*`: everything (pause windows only);
- scoped limits only: `project:<id>`, every member of a project (Project), and `model:<provider>/<model>`,
  the dollars of every run that may call that model (stored lowercase: model ids compare so).

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
PROJECT_PREFIX, MODEL_PREFIX = "project:", "model:"
_PROJECT_SLUG = re.compile(r"^[a-z0-9-]{1,32}$")
_PROVIDER = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_MODEL = re.compile(r"^[^\s\x00-\x1f\x7f]{1,64}$")
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


def _limit_row(raw: str) -> str:
    prefix, _, rest = raw.partition(":")
    if f"{prefix}:" == PROJECT_PREFIX:
        if not _PROJECT_SLUG.fullmatch(rest):
            raise ScopeError(f"{raw!r}: a project id is 1-32 lowercase letters, digits and '-'.")
        return raw
    provider, slash, model = rest.lower().partition("/")
    if not (slash and _PROVIDER.fullmatch(provider) and _MODEL.fullmatch(model)):
        raise ScopeError(f"{raw!r}: a model row is model:<provider>/<model>, e.g. model:anthropic/claude-sonnet-4.")
    return f"{MODEL_PREFIX}{provider}/{model}"


def parse_scope(raw: str, *, allow_everything: bool, allow_rows: bool = False) -> str:
    """The canonical form of a scope, or ScopeError saying what is wrong. `allow_rows`: a scoped limit's
    `project:<id>` and `model:<provider>/<model>` rows too."""
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
    near = re.sub(r"[\s_]", "", forge).lower().rstrip("s")
    if allow_rows and sep and f"{forge}:" in (PROJECT_PREFIX, MODEL_PREFIX):
        return _limit_row(raw)
    if allow_rows and sep and f"{near}:" in (PROJECT_PREFIX, MODEL_PREFIX):
        # `Model:`, `models:`, `model :` would be a forge nobody has: it would cap nothing.
        raise ScopeError(f"{raw!r}: spell the prefix exactly {near}: (lowercase, no space).")
    if sep:
        if forge not in FORGE_KINDS:
            raise ScopeError(f"{raw!r}: unknown forge prefix {forge!r} (use {', '.join(FORGE_KINDS)}).")
        return f"{forge}:{_check_repo(rest, raw)}"
    return _check_repo(raw, raw)


def parse_member(raw) -> str:
    """A project member's canonical form: a forge-qualified repository or an absolute folder (a bare
    `owner/name` would be every forge's repository of that name)."""
    if not isinstance(raw, str):
        raise ScopeError("a member is a string: github:owner/repo or an absolute folder.")
    member = parse_scope(raw, allow_everything=False)
    if not member.startswith("/") and ":" not in member:
        raise ScopeError(f"{raw!r}: name the forge, e.g. github:{raw} (a bare owner/repo is refused in a project).")
    return member


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
