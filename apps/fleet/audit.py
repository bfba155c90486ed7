"""The audit row of an operator action, written best-effort after the change itself.

The fleet's stop switch must work with Redis alone, so a database that is down, misconfigured or slow
costs the audit row, never the action: the write runs in a helper thread bounded by AUDIT_WAIT_SECONDS
and the caller says in its answer when it could not be written.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime

from django.db import close_old_connections, connection

logger = logging.getLogger("pidispatch.fleet")

AUDIT_WAIT_SECONDS = 5.0


def record(action: str, *, actor: str, queues=(), job_id: str = "", note: str = "",
           until: datetime | None = None, outcome: str = "") -> str:
    """Write the row; returns "" when written, else why not (for the operator's answer)."""
    result: dict[str, str] = {}

    def write():
        from .models import FleetAction

        try:
            close_old_connections()
            FleetAction.objects.create(action=action, actor=actor[:150], queues=list(queues), job_id=job_id,
                                       note=note[:500], until=until, outcome=outcome[:500])
            result["error"] = ""
        except Exception as exc:  # any database or configuration error: the action itself stands
            result["error"] = type(exc).__name__
        finally:
            connection.close()

    thread = threading.Thread(target=write, name="fleet-audit", daemon=True)
    thread.start()
    thread.join(AUDIT_WAIT_SECONDS)
    if "error" not in result:
        why = f"the database did not answer within {AUDIT_WAIT_SECONDS:.0f} s"
    elif result["error"]:
        why = f"database error {result['error']}"
    else:
        return ""
    logger.warning("fleet_audit_unwritten action=%s job=%s queues=%d why=%s", action, job_id or "-", len(queues),
                   why.replace(" ", "-"))
    return why
