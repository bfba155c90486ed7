"""SQLite's write-ahead log: its fsync and its checkpoint, both moved out of the way of other writers.

A commit under synchronous=FULL syncs the log while it still holds SQLite's one write lock, so under load the
web workers' commits queue behind each other's fsync. The inbox's writes that wait for the disk (an ignored
delivery's settle, a pending one's) commit without it and call `sync_log()`, the same fsync after the lock is
released: the others commit meanwhile, and the kernel flushes the log for all who wait at once.

Every commit appends to the write-ahead log; a checkpoint copies the log back into the database file. By
default SQLite does that every 1000 pages inside whichever commit crosses the mark, so a webhook answer
pays for it. Our connections checkpoint only past 10000 pages (settings.py), and the inbox replayer, which
runs beside the web server, checkpoints each pass. Fewer, larger checkpoints also copy a page the inbox
rewrote many times (its newest rows, a freed payload's pages) once instead of once per mark.
"""

import os

from django.db import DatabaseError, connection


def sync_log(connection) -> None:
    """fdatasync the log after a commit made without one: everything up to this connection's last commit is
    then on disk (frames a checkpoint moved meanwhile are in the database file, which the checkpoint synced).
    Raises DatabaseError when the disk refuses, as the commit would have."""
    try:
        log = os.open(f"{connection.settings_dict['NAME']}-wal", os.O_RDONLY)
    except FileNotFoundError:
        return  # no log file: an in-memory database; a file database in WAL mode keeps it while we are connected
    except OSError as error:
        raise DatabaseError(f"could not open the database's log: {error.strerror}") from error
    try:
        os.fdatasync(log)
    except OSError as error:
        raise DatabaseError(f"could not sync the database's log: {error.strerror}") from error
    finally:
        os.close(log)


def checkpoint() -> None:
    """A passive checkpoint: copies what no reader still needs, never waits for or blocks a writer."""
    if connection.vendor != "sqlite":
        return
    try:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")
    except DatabaseError:
        pass  # the next pass tries again; a commit past the mark checkpoints by itself
