"""Repository names as a forge can write them. A delivery, even a signed one, naming a repository no forge could
have named (`#`, `:`, `?`, `%`, a `.` or `..` segment, a control character, a space where the forge allows none)
is refused before anything is queued (400 `repository-invalid`): such a name would reach a clone URL, an API path
and a scope key as it is.

GitHub, Forgejo and GitLab: path segments of ASCII letters, digits, `_`, `.` and `-` (GitHub and Forgejo: exactly
`owner/name`; GitLab: a group path of any depth, then the project). Azure DevOps: a project and a repository name,
which may hold spaces but none of the characters Azure DevOps forbids in either.
"""

from __future__ import annotations

import re

SEGMENT = re.compile(r"[A-Za-z0-9_.-]{1,100}")
AZURE_FORBIDDEN = set('\\/:*?"<>|;#$%{}[]+=,&@~^`') | {chr(code) for code in range(32)} | {"\x7f"}
AZURE_MAX = 64


def path_problem(name: str, *, segments: int | None) -> bool:
    """True when `name` is not slash-separated forge segments (`segments` of them, or two or more when None)."""
    parts = name.split("/")
    if segments is not None and len(parts) != segments or segments is None and len(parts) < 2:
        return True
    return any(not SEGMENT.fullmatch(part) or part in (".", "..") or part.lower().endswith(".git")
               for part in parts)


def azure_name_problem(name: str) -> bool:
    return (not name or len(name) > AZURE_MAX or name != name.strip() or name.startswith(("_", "."))
            or name.endswith(".") or any(ch in AZURE_FORBIDDEN for ch in name))
