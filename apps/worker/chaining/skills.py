"""Which flows allow being chained: those whose `.pi/skills/<flow>/SKILL.md` carries `ai-trigger: allow` in its
frontmatter, read as it was at the commit the parent started from, before its agent ran (the agent can write the
folder, so what it leaves there after its run is never read).

A forge job's `.pi/` was copied from the git object store at that commit into its read-only `/job/pi/`
(apps/worker/sandbox/repo_skills.py); a local job's is read from its folder's object store at HEAD, as the folder's
owner, before the container starts. Links and files larger than MAX_SKILL_BYTES allow nothing. Default deny: any
doubt (git fails, no frontmatter, another value) leaves the flow out.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
import subprocess
from pathlib import Path

from apps.worker.name_patterns import FLOW_PATTERN
from apps.worker.sandbox.repo_skills import REGULAR_FILES
from apps.worker.sandbox.workspace import folder_git

logger = logging.getLogger("pidispatch.chaining")

MAX_SKILL_BYTES = 64 * 1024
AI_TRIGGER = re.compile(r"""^ai-trigger:\s*(["']?)allow\1\s*$""")
_SKILL_PATH = re.compile(r"^\.pi/skills/([^/]+)/SKILL\.md$")


def allows_chaining(content: bytes) -> bool:
    """Does this SKILL.md's frontmatter (between the first two `---` lines) say exactly `ai-trigger: allow`?"""
    lines = content.decode("utf-8", errors="replace").splitlines()
    if not lines or lines[0].strip() != "---":
        return False
    for line in lines[1:]:
        if line.strip() == "---":
            return False
        if AI_TRIGGER.fullmatch(line.strip()):
            return True
    return False


def chainable_in_job_folder(job_dir: Path) -> frozenset[str]:
    """A forge job's: from the `.pi/` the worker copied into `/job/pi/` (never a link, never a big file)."""
    skills = job_dir / "pi" / "skills"
    try:
        names = [entry.name for entry in os.scandir(skills) if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return frozenset()
    allowed = set()
    for name in names:
        if not FLOW_PATTERN.fullmatch(name):
            continue
        try:
            descriptor = os.open(skills / name / "SKILL.md", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if stat.S_ISREG(os.fstat(descriptor).st_mode):
                content = os.read(descriptor, MAX_SKILL_BYTES + 1)
                if len(content) <= MAX_SKILL_BYTES and allows_chaining(content):
                    allowed.add(name)
        finally:
            os.close(descriptor)
    return frozenset(allowed)


def chainable_in_folder(folder: Path, owner: tuple[int, int], job_id: str) -> frozenset[str]:
    """A local job's: from its folder's git object store at HEAD (called before the container starts)."""
    try:
        listing = folder_git(folder, owner, "ls-tree", "-r", "-l", "-z", "--full-tree", "HEAD", "--", ".pi/skills/")
        if listing.returncode != 0:
            raise OSError("ls-tree failed")
        blobs = {}
        for record in listing.stdout.split(b"\0"):
            meta, _, path = record.partition(b"\t")
            parts = meta.decode(errors="replace").split()
            match = _SKILL_PATH.fullmatch(path.decode("utf-8", errors="replace"))
            if len(parts) != 4 or not match or not FLOW_PATTERN.fullmatch(match.group(1)):
                continue
            mode, kind, oid, size = parts
            if kind == "blob" and mode in REGULAR_FILES and size.isdigit() and int(size) <= MAX_SKILL_BYTES:
                blobs[match.group(1)] = oid
        if not blobs:
            return frozenset()
        batch = folder_git(folder, owner, "cat-file", "--batch", stdin="\n".join(blobs.values()).encode() + b"\n")
        if batch.returncode != 0:
            raise OSError("cat-file failed")
    except (OSError, subprocess.TimeoutExpired):
        logger.warning("chain_skills_unreadable job=%s", job_id)
        return frozenset()
    contents, position, output = {}, 0, batch.stdout
    for oid in blobs.values():
        header_end = output.find(b"\n", position)
        header = output[position:header_end].split()
        if header_end < 0 or len(header) != 3:
            break
        size = int(header[2])
        contents[oid] = output[header_end + 1:header_end + 1 + size]
        position = header_end + 1 + size + 1
    return frozenset(name for name, oid in blobs.items() if allows_chaining(contents.get(oid, b"")))


# --- the chain's `.pi/`, pinned at its first job ------------------------------------------------------------------

NO_PI = "none"
PI_DIGEST_MAX_BYTES = 16 * 1024 * 1024  # past it, a `.pi/` pins nothing: its children are refused


def pi_digest(workspace: Path) -> str:
    """A digest of the workspace's `.pi/` as the job starts on it (paths, modes, contents): what the chain's first
    job pins and every child of the chain must find again. NO_PI without one. A unique value that matches nothing
    when it cannot be read whole, or when it is or holds a link: pi follows links, to files the digest never read
    (a parent could change them), so such a `.pi/` pins nothing and the chain's children are refused."""
    root = workspace / ".pi"
    try:
        if stat.S_ISLNK(os.lstat(root).st_mode):
            return f"holds-a-link-{os.urandom(8).hex()}"
    except FileNotFoundError:
        return NO_PI
    except OSError:
        return f"unreadable-{os.urandom(8).hex()}"
    if not root.is_dir():
        return NO_PI  # a file named .pi: pi reads no skills from it
    digest, total = hashlib.sha256(), 0
    for folder, folders, files in os.walk(root, followlinks=False):
        folders.sort()
        for name in sorted([*files, *(entry for entry in folders if os.path.islink(os.path.join(folder, entry)))]):
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, root).encode("utf-8", "surrogateescape")
            try:
                info = os.lstat(path)
                if stat.S_ISLNK(info.st_mode):
                    return f"holds-a-link-{os.urandom(8).hex()}"
                if stat.S_ISREG(info.st_mode):
                    total += info.st_size
                    if total > PI_DIGEST_MAX_BYTES:
                        return f"too-large-{os.urandom(8).hex()}"
                    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
                    with os.fdopen(descriptor, "rb") as file:
                        content = file.read(info.st_size + 1)
                else:
                    content = b""
            except OSError:
                return f"unreadable-{os.urandom(8).hex()}"
            kind = stat.S_IFMT(info.st_mode) | (info.st_mode & 0o111)
            digest.update(b"%s\0%o\0%d\0" % (relative, kind, len(content)) + content)
    return digest.hexdigest()
