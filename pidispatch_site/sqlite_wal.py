"""SQLite's WAL checkpoint, moved off the webhook's path.

Every commit appends to the write-ahead log; a checkpoint copies the log back into the database file. By
default SQLite does that every 1000 pages inside whichever commit crosses the mark, so a webhook answer
pays for it. Our connections checkpoint only past 10000 pages (settings.py), and the inbox replayer, which
runs beside the web server, checkpoints each pass. Fewer, larger checkpoints also copy a page the inbox
rewrote many times (its newest rows, a freed payload's pages) once instead of once per mark.
"""

from django.db import DatabaseError, connection


def checkpoint() -> None:
    """A passive checkpoint: copies what no reader still needs, never waits for or blocks a writer."""
    if connection.vendor != "sqlite":
        return
    try:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")
    except DatabaseError:
        pass  # the next pass tries again; a commit past the mark checkpoints by itself
