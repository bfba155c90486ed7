"""Which folders of this host a job may reach: under a root the host declares for that use, and never the
deployment's own files. Two uses declare roots:

    PI_LOCAL_ROOTS    a folder run's folder, mounted read-write into the agent's container as the folder's owner:
                      whatever lies under it is the agent's to read and rewrite;
    PI_SKILLS_ROOTS   a trigger's skills folder (`run.skillsDir`), copied into each of its jobs (pi_overlay.py):
                      whatever lies under it is the agent's to read, and may leave the host in its commits.

So, for both:

- the roots come from this host's environment only (settings read both before `.env`), never from a file or the
  database, which a job or an integrator could rewrite; no root declared, nothing of that use on this host;
- the deployment's checkout (its settings, `.env`), `var/` (the secret key, the database), PI_JOB_ROOT (other jobs'
  folders) and /etc/pidispatch (the units' environment files, with every key), and any folder that holds one of
  them, are refused whatever the roots say; so are the kernel's /proc, /sys and /dev;
- a folder is judged by its real path (links followed), which is what the job then reaches: a link under a root
  that points elsewhere is judged where it points.

    judged = judge("/srv/code/app")               # or judge(path, SKILLS)
    judged.path    # the real path
    judged.why     # "" when allowed, else no-roots | outside-roots | deployment-files

Who asked is told a reason token and fixed words (hint), never the path; the path, its owner and why are logged
on this host only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

NO_ROOTS, OUTSIDE_ROOTS, DEPLOYMENT_FILES = "no-roots", "outside-roots", "deployment-files"
# Where the contrib units read their environment files: the provider's key and the forge's token live there.
CONFIG_DIR = Path("/etc/pidispatch")
KERNEL_FOLDERS = (Path("/proc"), Path("/sys"), Path("/dev"))


@dataclass(frozen=True)
class Use:
    """One use of declared roots: the setting that declares them, and what its folders are called."""

    setting: str
    what: str
    without: str  # what the host does without roots

    def hint(self, why: str) -> str:
        """What whoever asked is told (the admin's form, the API, a run's reason): fixed words, no path."""
        return {
            NO_ROOTS: f"this host declares no {self.what} roots ({self.setting} in its environment), so it "
                      f"{self.without}",
            OUTSIDE_ROOTS: f"the {self.what} is not under a root this host declares ({self.setting} in its "
                           "environment)",
            DEPLOYMENT_FILES: f"the {self.what} is, lies in or holds pidispatch's own files (its checkout, var/, "
                              "PI_JOB_ROOT or /etc/pidispatch) or the kernel's (/proc, /sys, /dev)",
        }[why]


LOCAL = Use("PI_LOCAL_ROOTS", "folder", "runs no folder")
SKILLS = Use("PI_SKILLS_ROOTS", "skills folder", "copies no skills folder into a job")


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
    """The folders no job may reach into, over, or under."""
    return tuple(_real(path) for path in (settings.BASE_DIR, settings.VAR_DIR, settings.PI_JOB_ROOT, CONFIG_DIR))


def roots(use: Use = LOCAL) -> tuple[Path, ...]:
    """The declared roots that can hold a folder (a relative entry never does)."""
    return tuple(_real(root) for root in getattr(settings, use.setting) if os.path.isabs(root))


def judge(folder: str, use: Use = LOCAL) -> Judged:
    """Where `folder` really is, and whether a job may reach it for `use`. Looks at nothing inside the folder."""
    path = _real(folder) if os.path.isabs(folder) else Path(folder)
    declared = roots(use)
    if not declared:
        return Judged(path, NO_ROOTS)
    if not path.is_absolute() or not any(_within(path, root) for root in declared):
        return Judged(path, OUTSIDE_ROOTS)
    if any(_within(path, own) or _within(own, path) for own in deployment_files()) or \
            any(_within(path, kernel) or path == Path("/") for kernel in KERNEL_FOLDERS):
        return Judged(path, DEPLOYMENT_FILES)
    return Judged(path, "")
