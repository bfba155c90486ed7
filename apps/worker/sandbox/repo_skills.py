"""The repository's `.pi/` (skills, persona, ...) at the cloned commit, copied into the job's read-only
`/job/pi/`, within bounds.

Read from git's object store at the commit, never from the working tree: a symlink, a submodule or a
file the checkout changed cannot smuggle anything in. Dot-files and dot-folders are skipped, symlinks and
submodules are skipped, executables are copied as plain files. Past a bound the job is refused with a
reason naming the bound: `pi-too-deep`, `pi-file-too-large`, `pi-too-many-files`, `pi-too-large`.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from apps.worker.sandbox.gitrun import run_git
from apps.worker.sandbox.workspace import WorkspaceRefused

MAX_FILES = 256
MAX_FILE_BYTES = 1024 * 1024
MAX_TOTAL_BYTES = 8 * 1024 * 1024
MAX_DEPTH = 4  # path segments below .pi/ (skills/<name>/<folder>/<file>)
PREFIX = ".pi/"
REGULAR_FILES = {"100644", "100755"}
GIT_TIMEOUT_SECONDS = 60


@dataclass(frozen=True)
class Entry:
    oid: str
    size: int
    path: str  # relative to .pi/


def materialise(repo: Path, sha: str, destination: Path) -> int:
    """Copy `.pi/` of commit `sha` into `destination`; the number of files copied."""
    entries = select(list_tree(repo, sha))
    if not entries:
        return 0
    contents = read_blobs(repo, [entry.oid for entry in entries])
    root = destination.resolve()
    for entry in entries:
        target = (root / entry.path).resolve()
        if root not in target.parents:  # unreachable after select(); kept as the last line of defence
            raise WorkspaceRefused("pi-path-refused", "a .pi/ path leaves the folder")
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        target.write_bytes(contents[entry.oid])
        target.chmod(0o644)
    for folder in [root, *(path for path in root.rglob("*") if path.is_dir())]:
        folder.chmod(0o755)
    return len(entries)


def list_tree(repo: Path, sha: str) -> list[tuple[str, str, str, str, str]]:
    """(mode, type, oid, size, path) of every entry below .pi/ at `sha`."""
    listing = _git(repo, "ls-tree", "-r", "-l", "-z", "--full-tree", sha, "--", PREFIX)
    rows = []
    for record in listing.split(b"\0"):
        if not record:
            continue
        meta, _, path = record.partition(b"\t")
        mode, kind, oid, size = meta.decode().split()
        rows.append((mode, kind, oid, size, path.decode("utf-8", errors="surrogateescape")))
    return rows


def select(rows, *, prefix: str = PREFIX, label: str = ".pi/", reason_prefix: str = "pi") -> list[Entry]:
    """What is copied, checked against the bounds in a fixed order (so a repo always gets the same reason).
    `rows` are (mode, type, oid, size, path) as git lists them; a host folder's copy (apps/worker/sandbox/pi_overlay.py)
    lists its files the same way and is held to the same bounds, with its own label and reason prefix."""
    entries = []
    for mode, kind, oid, size, path in rows:
        if not path.startswith(prefix):
            continue
        segments = path[len(prefix):].split("/")
        if any(not segment or segment.startswith(".") for segment in segments):
            continue  # dot-files and dot-folders (and `.`/`..`, which git never stores anyway)
        if kind != "blob" or mode not in REGULAR_FILES:
            continue  # symlinks and submodules
        if len(segments) > MAX_DEPTH:
            raise WorkspaceRefused(f"{reason_prefix}-too-deep", f"{label} nests deeper than {MAX_DEPTH} levels")
        entries.append(Entry(oid=oid, size=int(size), path="/".join(segments)))
    if any(entry.size > MAX_FILE_BYTES for entry in entries):
        raise WorkspaceRefused(f"{reason_prefix}-file-too-large", f"a file in {label} is larger than 1 MiB")
    if len(entries) > MAX_FILES:
        raise WorkspaceRefused(f"{reason_prefix}-too-many-files", f"{label} holds more than {MAX_FILES} files")
    if sum(entry.size for entry in entries) > MAX_TOTAL_BYTES:
        raise WorkspaceRefused(f"{reason_prefix}-too-large", f"{label} holds more than 8 MiB")
    return entries


def read_blobs(repo: Path, oids: list[str]) -> dict[str, bytes]:
    """All blobs in one `git cat-file --batch` (one process, not one per file)."""
    output = _git(repo, "cat-file", "--batch", stdin="\n".join(oids) + "\n")
    blobs, position = {}, 0
    for _ in oids:
        header_end = output.index(b"\n", position)
        header = output[position:header_end].decode().split()
        if len(header) != 3:  # "<oid> missing": the clone lacks an object it just listed
            raise WorkspaceRefused("pi-unreadable", "the repository's .pi/ could not be read at the cloned commit")
        oid, _, size = header
        start = header_end + 1
        blobs[oid] = output[start:start + int(size)]
        position = start + int(size) + 1
    return blobs


def _git(repo: Path, *args: str, stdin: str | None = None) -> bytes:
    try:
        result = run_git(repo, *args, timeout=GIT_TIMEOUT_SECONDS,
                         stdin=stdin.encode() if stdin is not None else None)
    except (subprocess.TimeoutExpired, OSError):
        result = None
    if result is None or result.returncode != 0:
        raise WorkspaceRefused("pi-unreadable", "the repository's .pi/ could not be read at the cloned commit")
    return result.stdout
