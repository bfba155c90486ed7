"""What the job's pi loads besides the repository's `.pi/`: the operator's overlay and a trigger's skills folder.

    PI_GLOBAL_PI_DIR/              the operator's overlay on this host (`manage.py import_pi` stages it), mounted
      skills/                      read-only at /opt/pi-global in every job
      prompts/
      extensions/                  loaded unless PI_GLOBAL_ALLOW_EXTENSIONS is false
      packages/<name>/             staged pi packages (PI_PACKAGES, unless the trigger says `run.packages: false`)
      AGENTS.md, APPEND_SYSTEM.md  the persona, copied beside the job's models.json

    run.skillsDir                  a host folder of skills, copied into /job/trigger-skills/ within the bounds of
                                   the repository's own `.pi/` copy (repo_skills.select): 256 files, 1 MiB each,
                                   8 MiB in all, 4 levels; dot-files and symlinks skipped, executables copied as
                                   plain files. Refused `skills-dir-missing` when it is not a folder.

pi finds all of it through the `settings.json` written here into its agent folder (PI_CODING_AGENT_DIR,
/job/pi-agent), beside the worker's own models.json: the overlay never brings a models.json or a key into the job
(the gateway adds the provider's key outside the container).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from apps.worker.sandbox import image_contract, repo_skills
from apps.worker.sandbox.workspace import WorkspaceRefused

MOUNT = "/opt/pi-global"
TRIGGER_SKILLS = "trigger-skills"  # under the job's /job folder
PERSONA_FILES = ("AGENTS.md", "APPEND_SYSTEM.md")
PERSONA_MAX_BYTES = 256 * 1024


@dataclass(frozen=True)
class Overlay:
    """What one job loads: the overlay's folder on the host (None: no overlay) and its staged packages."""

    folder: Path | None
    packages: tuple[str, ...] = ()  # paths inside the container

    def mounts(self) -> list[tuple[str, str]]:
        return [(str(self.folder), MOUNT)] if self.folder is not None else []

    def environment(self) -> dict[str, str]:
        return {"PI_PACKAGES": ":".join(self.packages)} if self.packages else {}


def overlay_folder() -> Path | None:
    """The host's overlay, when PI_GLOBAL_PI_DIR names a folder that is there."""
    configured = settings.PI_GLOBAL_PI_DIR
    if not configured:
        return None
    folder = Path(configured)
    return folder if folder.is_dir() else None


def staged_packages(folder: Path) -> list[str]:
    """The packages staged in the overlay, as paths inside the container (folders only, no dot-folders or links)."""
    root = folder / "packages"
    if not root.is_dir() or root.is_symlink():
        return []
    return [f"{MOUNT}/packages/{entry.name}" for entry in sorted(os.scandir(root), key=lambda e: e.name)
            if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False)]


def prepare(job_folder: Path, *, packages: bool, skills_dir: str) -> Overlay:
    """Copy a trigger's skills folder and the overlay's persona into the job's folder and write pi's settings.json;
    the mount and environment the container needs. WorkspaceRefused (skills-dir-*) for a bad skills folder."""
    agent = job_folder / image_contract.AGENT_DIR.rsplit("/", 1)[1]
    agent.mkdir(mode=0o755, exist_ok=True)
    document: dict = {}
    if skills_dir:
        copy_skills_folder(Path(skills_dir), job_folder / TRIGGER_SKILLS)
        document.setdefault("skills", []).append(f"/job/{TRIGGER_SKILLS}")
    folder = overlay_folder()
    staged: list[str] = []
    if folder is not None:
        for name, key in (("skills", "skills"), ("prompts", "prompts")):
            if (folder / name).is_dir():
                document.setdefault(key, []).insert(0, f"{MOUNT}/{name}")
        if settings.PI_GLOBAL_ALLOW_EXTENSIONS and (folder / "extensions").is_dir():
            document["extensions"] = [f"{MOUNT}/extensions"]
        if packages:
            staged = staged_packages(folder)
            document["packages"] = staged if settings.PI_GLOBAL_ALLOW_EXTENSIONS else \
                [{"source": path, "extensions": []} for path in staged]
        _copy_persona(folder, agent)
    path = agent / "settings.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    path.chmod(0o644)
    return Overlay(folder=folder, packages=tuple(staged))


def _copy_persona(folder: Path, agent: Path) -> None:
    for name in PERSONA_FILES:
        source = folder / name
        try:
            info = source.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_size <= PERSONA_MAX_BYTES:
            (agent / name).write_bytes(source.read_bytes())
            (agent / name).chmod(0o644)


def copy_skills_folder(source: Path, destination: Path) -> int:
    """A trigger's skills folder into the job, within the `.pi/` copy's bounds; the number of files copied."""
    try:
        is_folder = stat.S_ISDIR(source.lstat().st_mode)  # a link to a folder is not the folder the trigger named
    except OSError:
        is_folder = False
    if not source.is_absolute() or not is_folder:
        raise WorkspaceRefused("skills-dir-missing", "run.skillsDir is not a folder on this host")
    entries = repo_skills.select(list_folder(source), prefix="", label="run.skillsDir", reason_prefix="skills-dir")
    root = destination
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    for entry in entries:
        target = root / entry.path
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        with open(source / entry.path, "rb") as file:  # entry.oid is the path: read again, never followed as a link
            target.write_bytes(file.read(repo_skills.MAX_FILE_BYTES + 1)[:entry.size])
        target.chmod(0o644)
    for folder in [root, *(path for path in root.rglob("*") if path.is_dir())]:
        folder.chmod(0o755)
    return len(entries)


def list_folder(source: Path) -> list[tuple[str, str, str, str, str]]:
    """A host folder's files as git's ls-tree rows (mode, type, oid, size, path), links not followed, so that
    repo_skills.select holds them to the same rules: a link or a special file is listed as not a blob."""
    rows = []
    for folder, folders, files in os.walk(source, followlinks=False):
        relative = os.path.relpath(folder, source)
        for name in [*files, *(entry for entry in folders if os.path.islink(os.path.join(folder, entry)))]:
            path = name if relative == "." else f"{relative}/{name}"
            info = os.lstat(os.path.join(folder, name))
            if stat.S_ISREG(info.st_mode):
                mode = "100755" if info.st_mode & 0o111 else "100644"
                rows.append((mode, "blob", path, str(info.st_size), path))
            else:
                rows.append(("120000", "link", path, "0", path))
    return rows
