"""What the job's pi loads besides the repository's `.pi/`: the operator's overlay and a trigger's skills folder.

    PI_GLOBAL_PI_DIR/              the operator's overlay on this host (`manage.py import_pi` stages it), mounted
      skills/                      read-only at /opt/pi-global in every job
      prompts/
      extensions/                  loaded unless PI_GLOBAL_ALLOW_EXTENSIONS is false
      packages/<name>/             staged pi packages (PI_PACKAGES, unless the trigger says `run.packages: false`)
      AGENTS.md, APPEND_SYSTEM.md  the persona, copied beside the job's models.json

    run.skillsDir                  a host folder of skills under a root the host declares (PI_SKILLS_ROOTS),
                                   copied into /job/trigger-skills/ as any user of the host may read it, within
                                   the bounds of the repository's own `.pi/` copy (skills_folder.py).

pi is told about all of it by flags: the runner (image/runner/runner.mjs) reads /job/pi-resources.json, written
here, and passes each entry as `-e` (a package, loaded by pi's package rules: its extensions, skills, prompts and
themes), `--skill` or `--prompt-template`. Not a settings.json in pi's agent folder: pi locks that file
(`settings.json.lock` beside it) before reading it, which fails on the read-only /job, and pi then loads nothing
of it. The overlay never brings a models.json or a key into the job (the worker writes the job's models.json;
the gateway adds the provider's key outside the container).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from apps.worker.sandbox import image_contract, skills_folder

MOUNT = "/opt/pi-global"
TRIGGER_SKILLS = "trigger-skills"  # under the job's /job folder
RESOURCES_FILE = "pi-resources.json"  # under /job: what the runner passes to pi as -e, --skill, --prompt-template
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
    """Copy a trigger's skills folder and the overlay's persona into the job's folder and write the resources file
    the runner turns into pi's flags; the mount and environment the container needs. WorkspaceRefused
    (skills-dir-*) for a bad skills folder."""
    agent = job_folder / image_contract.AGENT_DIR.rsplit("/", 1)[1]
    agent.mkdir(mode=0o755, exist_ok=True)
    resources: dict[str, list[str]] = {"extensions": [], "skills": [], "promptTemplates": []}
    folder = overlay_folder()
    staged: list[str] = []
    if folder is not None:
        staged = staged_packages(folder) if packages else []
        for root in [folder, *(folder / "packages" / Path(path).name for path in staged)]:
            inside = MOUNT if root == folder else f"{MOUNT}/packages/{root.name}"
            _add_package(resources, root, inside)
        _copy_persona(folder, agent)
    if skills_dir:
        skills_folder.copy(skills_dir, job_folder / TRIGGER_SKILLS)
        resources["skills"].append(f"/job/{TRIGGER_SKILLS}")
    path = job_folder / RESOURCES_FILE
    path.write_text(json.dumps(resources, indent=2) + "\n")
    path.chmod(0o644)
    return Overlay(folder=folder, packages=tuple(staged))


def _add_package(resources: dict[str, list[str]], root: Path, inside: str) -> None:
    """A pi package (the overlay's own folder is one: skills/, prompts/, extensions/) as the runner's flags: whole
    (`-e`, pi's package rules) while extensions are allowed, else only its skills and prompt templates."""
    if settings.PI_GLOBAL_ALLOW_EXTENSIONS:
        if any((root / kind).is_dir() for kind in ("skills", "prompts", "extensions", "themes")) or \
                (root / "package.json").is_file():
            resources["extensions"].append(inside)
        return
    manifest = _pi_manifest(root)
    for kind, key in (("skills", "skills"), ("prompts", "promptTemplates")):
        for entry in manifest.get(kind) or [kind]:
            relative = entry.removeprefix("./") if isinstance(entry, str) else ""
            if relative and not relative.startswith(("/", "..", "!", "+", "-")) and "*" not in relative \
                    and (root / relative).exists():
                resources[key].append(f"{inside}/{relative}".rstrip("/"))


def _pi_manifest(root: Path) -> dict:
    try:
        manifest = json.loads((root / "package.json").read_text()).get("pi")
    except (OSError, ValueError, AttributeError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


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
