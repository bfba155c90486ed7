"""A trigger's skills folder (`run.skillsDir`), copied into the job's /job/trigger-skills/.

The worker runs as root and the copy ends up in the agent's hands (and may leave the host in its commits), so:

- the folder is judged first, by its real path, before anything looks inside it (folder_roots.judge, SKILLS):
  under a root the host declares in PI_SKILLS_ROOTS, never pidispatch's own files (`skills-dir-not-allowed`);
- it is then opened from / one name at a time, never following a link, so the folder copied is the folder
  judged; a name swapped for a link meanwhile is refused;
- it is walked by directory descriptors (openat, O_NOFOLLOW) and every file is judged by fstat on what was
  opened: a file swapped for a link between the listing and the read is never followed, nor is a fifo read;
- only what every user of the host may read is copied (folders o+rx, files o+r): root's power to read a
  root-only file never reaches the job, which is refused `skills-dir-unreadable` instead of getting it at 0644;
- within the bounds of the repository's `.pi/` copy (repo_skills.select): 256 files, 1 MiB each, 8 MiB in all,
  4 levels; dot-files and links skipped, executables copied as plain files.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from apps.worker.sandbox import folder_roots, repo_skills
from apps.worker.sandbox.workspace import WorkspaceRefused

logger = logging.getLogger("pidispatch.worker")

FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
READABLE_FOLDER = stat.S_IROTH | stat.S_IXOTH
LABEL = "run.skillsDir"


def _missing() -> WorkspaceRefused:
    return WorkspaceRefused("skills-dir-missing", "run.skillsDir is not a folder on this host")


def _changed() -> WorkspaceRefused:
    return WorkspaceRefused("skills-dir-not-allowed", "run.skillsDir changed while it was read")


def _unreadable(path: str) -> WorkspaceRefused:
    return WorkspaceRefused("skills-dir-unreadable", f"{path or 'the folder'} in run.skillsDir is not readable by "
                                                     "every user of the host")


def copy(source: str, destination: Path) -> int:
    """Copy the skills folder `source` into `destination`; the number of files copied. WorkspaceRefused
    (skills-dir-*) for a folder that is not allowed, missing, unreadable or past a bound."""
    if not os.path.isabs(source):
        raise _missing()
    judged = folder_roots.judge(source, folder_roots.SKILLS)
    if not judged.allowed:
        # The path stays in this host's log: the run's reason says only why.
        logger.warning("skills_dir_not_allowed folder=%r why=%s", str(judged.path), judged.why)
        raise WorkspaceRefused("skills-dir-not-allowed", folder_roots.SKILLS.hint(judged.why))
    if os.path.islink(source):
        raise _missing()  # a link to a folder is not the folder the trigger named
    root = _open_real_folder(judged.path)
    try:
        _require_readable_folder(root, "")
        rows: list[tuple[str, str, str, str, str]] = []
        _list(root, "", 1, rows)
        entries = repo_skills.select(rows, prefix="", label=LABEL, reason_prefix="skills-dir")
        destination.mkdir(mode=0o755, parents=True, exist_ok=True)
        for entry in entries:
            target = destination / entry.path
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            target.write_bytes(_read(root, entry))
            target.chmod(0o644)
    finally:
        os.close(root)
    for folder in [destination, *(path for path in destination.rglob("*") if path.is_dir())]:
        folder.chmod(0o755)
    return len(entries)


def _open_real_folder(path: Path) -> int:
    """A descriptor of the folder at the real path `path`, opened from / one name at a time without following
    a link: a name that became a link since the path was judged is refused."""
    folder = os.open("/", FOLDER_FLAGS)
    try:
        for name in path.parts[1:]:
            opened = os.open(name, FOLDER_FLAGS, dir_fd=folder)
            os.close(folder)
            folder = opened
    except (FileNotFoundError, NotADirectoryError):
        os.close(folder)
        raise _missing() from None
    except OSError:  # ELOOP: a link where the judged path had a folder
        os.close(folder)
        raise _changed() from None
    return folder


def _require_readable_folder(folder: int, path: str) -> None:
    if os.fstat(folder).st_mode & READABLE_FOLDER != READABLE_FOLDER:
        raise _unreadable(path)


def _list(folder: int, prefix: str, depth: int, rows: list) -> None:
    """The folder's files as git's ls-tree rows (mode, type, oid, size, path), the oid being the path, so that
    repo_skills.select holds them to the `.pi/` copy's rules: a link or a special file is listed as not a blob.
    Dot-entries are neither listed nor walked; nothing deeper than one level past the bound is walked."""
    with os.scandir(folder) as found:
        names = sorted((entry.name, entry.stat(follow_symlinks=False)) for entry in found
                       if not entry.name.startswith("."))
    for name, info in names:
        path = f"{prefix}{name}"
        if stat.S_ISREG(info.st_mode):
            mode = "100755" if info.st_mode & 0o111 else "100644"
            rows.append((mode, "blob", path, str(info.st_size), path))
        elif stat.S_ISDIR(info.st_mode) and depth <= repo_skills.MAX_DEPTH:
            try:
                child = os.open(name, FOLDER_FLAGS, dir_fd=folder)
            except OSError:
                raise _changed() from None
            try:
                _require_readable_folder(child, path)
                _list(child, f"{path}/", depth + 1, rows)
            finally:
                os.close(child)
        elif not stat.S_ISDIR(info.st_mode):
            rows.append(("120000", "link", path, "0", path))
        if len(rows) > 4 * repo_skills.MAX_FILES:
            return  # past every bound already: select refuses it


def _read(root: int, entry: repo_skills.Entry) -> bytes:
    """The entry's bytes (at most its listed size), reached from the root's descriptor, name by name."""
    *folders, name = entry.path.split("/")
    opened: list[int] = []
    try:
        folder = root
        for index, part in enumerate(folders):
            folder = os.open(part, FOLDER_FLAGS, dir_fd=folder)
            opened.append(folder)
            _require_readable_folder(folder, "/".join(folders[:index + 1]))
        file = os.open(name, FILE_FLAGS, dir_fd=folder)
        opened.append(file)
        info = os.fstat(file)
        if not stat.S_ISREG(info.st_mode):
            raise _changed()
        if not info.st_mode & stat.S_IROTH:
            raise _unreadable(entry.path)
        chunks, left = [], entry.size
        while left > 0:
            chunk = os.read(file, min(left, 1024 * 1024))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:  # a link (ELOOP) or nothing where the listing found a file or a folder
        raise _changed() from None
    finally:
        for descriptor in reversed(opened):
            os.close(descriptor)
