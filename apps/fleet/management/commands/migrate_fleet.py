"""`python manage.py migrate_fleet`: `migrate`, once per fleet however many hosts upgrade at once.

Hosts upgrading side by side (contrib/upgrade.sh on each) would each run `migrate`; two at once could both try
the same migration. On PostgreSQL a session advisory lock makes them take turns: the first applies what is new,
the next finds nothing left to do. SQLite serves one host, whose own upgrade is the only one.
"""

from __future__ import annotations

import time

from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import connection

# pg_advisory_lock's key: any fixed number no other lock of this database uses ("pidi" in ASCII).
LOCK_KEY = 0x70696469


class Command(BaseCommand):
    help = "Apply the database migrations, one host of the fleet at a time (PostgreSQL advisory lock)."

    def handle(self, *args, **options):
        if connection.vendor != "postgresql":
            call_command("migrate", interactive=False, verbosity=options["verbosity"])
            return
        started = time.monotonic()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [LOCK_KEY])
            if not cursor.fetchone()[0]:
                self.stdout.write("another host is migrating the database: waiting for it")
                cursor.execute("SELECT pg_advisory_lock(%s)", [LOCK_KEY])
            try:
                call_command("migrate", interactive=False, verbosity=options["verbosity"])
            finally:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [LOCK_KEY])
        self.stdout.write(f"the database is at this release's migrations ({time.monotonic() - started:.1f} s)")
