"""Which folders of this host a local job may work in: under a root the host declares (PI_LOCAL_ROOTS), and never
the deployment's own files.

A folder run mounts its folder read-write into the agent's container, as the folder's owner: whatever lies under
it is the agent's to read and rewrite. So:

- the roots come from this host's environment only (settings read PI_LOCAL_ROOTS before `.env`), never from a
  file or the database, which such a run could rewrite; no root declared, no folder run on this host;
- the deployment's checkout (its settings, `.env`), `var/` (the secret key, the database) and PI_JOB_ROOT (other
  jobs' folders), and any folder that holds one of them, are refused whatever the roots say;
- a folder is judged by its real path (links followed), which is what the job then mounts: a link under a root
  that points elsewhere is judged where it points.

    judged = judge("/srv/code/app")
    judged.path    # the real path
    judged.why     # "" when allowed, else no-roots | outside-roots | deployment-files

Who asked is told `folder-not-allowed` and no more (workspace.py); the path, its owner and why are logged on this
host only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

NO_ROOTS, OUTSIDE_ROOTS, DEPLOYMENT_FILES = "no-roots", "outside-roots", "deployment-files"
# What the host's own operator is told (the admin's form, dispatch_run): fixed words, no path.
HINTS = {
    NO_ROOTS: "this host declares no folder roots (PI_LOCAL_ROOTS in its environment), so it runs no folder",
    OUTSIDE_ROOTS: "the folder is not under a root this host declares (PI_LOCAL_ROOTS in its environment)",
    DEPLOYMENT_FILES: "the folder is, lies in or holds pidispatch's own files (its checkout, var/ or PI_JOB_ROOT)",
}


@dataclass(frozen=True)
class Judged:
    path: Path
    why: str  # "" when the folder is allowed

    @property
    def allowed(self) -> bool:
        return not self.why


def _real(path: str | Path) -> Path:
    return Path(os.path.realpath(path))


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def deployment_files() -> tuple[Path, ...]:
    """The folders no job may run in, over, or under."""
    return tuple(_real(path) for path in (settings.BASE_DIR, settings.VAR_DIR, settings.PI_JOB_ROOT))


def roots() -> tuple[Path, ...]:
    """The declared roots that can hold a folder (a relative entry never does)."""
    return tuple(_real(root) for root in settings.PI_LOCAL_ROOTS if os.path.isabs(root))


def judge(folder: str) -> Judged:
    """Where `folder` really is, and whether a local job may work there. Looks at nothing inside the folder."""
    path = _real(folder) if os.path.isabs(folder) else Path(folder)
    declared = roots()
    if not declared:
        return Judged(path, NO_ROOTS)
    if not path.is_absolute() or not any(_within(path, root) for root in declared):
        return Judged(path, OUTSIDE_ROOTS)
    if any(_within(path, own) or _within(own, path) for own in deployment_files()):
        return Judged(path, DEPLOYMENT_FILES)
    return Judged(path, "")
