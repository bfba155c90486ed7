"""What the installation keeps on disk is for its own user only: `var/` (0700), the secret key and the
SQLite database (0600; SQLite gives its -wal and -shm files the database's mode). Settings calls these at
start, before anything is written there. Modes looser than that, left by an older version, are tightened
wherever this user owns the file."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured


def _tighten(path: Path, mode: int) -> None:
    status = path.stat()
    if status.st_mode & 0o777 & ~mode and status.st_uid == os.geteuid():
        path.chmod(mode)


def private_folder(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    _tighten(path, 0o700)


def private_file(path: Path) -> None:
    """Creates the (empty) file 0600 unless it exists; its folder must exist."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        _tighten(path, 0o600)


def persistent_secret_key(path: Path) -> str:
    """The key generated once per installation, so a fresh clone needs no manual step. It is written whole
    to a file of this process's own (O_CREAT|O_EXCL, 0600), then linked into place, which fails when the
    key exists: starts racing for the first key all read the one that was linked first, never a part."""
    if not path.exists():
        staged = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(descriptor, "w") as file:
                file.write(secrets.token_urlsafe(50))
                file.flush()
                os.fsync(file.fileno())
            os.link(staged, path)
        except FileExistsError:
            pass  # another start made it first
        finally:
            staged.unlink(missing_ok=True)
    _tighten(path, 0o600)
    key = path.read_text().strip()
    if not key:
        raise ImproperlyConfigured(
            f"The secret key file {path} is empty. Delete it and start again to have a new key generated "
            "(everyone is logged out), or set DJANGO_SECRET_KEY."
        )
    return key
