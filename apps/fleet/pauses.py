"""Pause and resume, per queue: flags in Redis that workers honour within about a second, each also a row of the
record (QueuePause), from which state.py rebuilds them when Redis lost its data.

A pause stops workers from taking new jobs off the queue; jobs still enqueue and running jobs finish.
Each pause carries who, when, an optional note and an optional auto-resume time (`until`); the first
reader after `until` (usually a worker, within a second) clears it and leaves an `auto-resume` audit row.
Every change leaves an audit row in the DB, best-effort (see audit.py).

Redis keys (no expiry: a pause outlives every process, including the host that drains the queue):
    pidispatch:pause:<queue>   HASH by, at (ISO), note, until (ISO or "")
    pidispatch:paused          SET  the queue names that carry a pause flag
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.utils import timezone
from redis.exceptions import RedisError

from . import audit, state
from .connection import text
from .queues import is_dispatch_queue

logger = logging.getLogger("pidispatch.fleet")

INDEX = "pidispatch:paused"
NOTE_MAX = 500
# Clears a flag only if it still carries the auto-resume time the reader saw (a new pause wins).
_EXPIRE_IF_UNCHANGED = """
if redis.call('HGET', KEYS[1], 'until') == ARGV[1] then
    redis.call('DEL', KEYS[1])
    redis.call('SREM', KEYS[2], ARGV[2])
    return 1
end
return 0
"""


# Pauses a queue unless it is paused already: a second pause keeps the first one's who, when, note and until.
# Indexed first: a flag key that cannot be read still counts as a pause (the stop switch fails safe).
_PAUSE_IF_NOT_PAUSED = """
redis.call('SADD', KEYS[2], ARGV[5])
if redis.call('HEXISTS', KEYS[1], 'at') == 1 then
    return 0
end
redis.call('HSET', KEYS[1], 'by', ARGV[1], 'at', ARGV[2], 'note', ARGV[3], 'until', ARGV[4])
return 1
"""


def flag_key(queue: str) -> str:
    return f"pidispatch:pause:{queue}"


def write_flag(pipe, queue: str, *, by: str, at: datetime, note: str, until: datetime | None) -> None:
    """The queue's pause flag, unless it is paused already (queued on `pipe`)."""
    pipe.eval(_PAUSE_IF_NOT_PAUSED, 2, flag_key(queue), INDEX, by, at.isoformat(), (note or "")[:NOTE_MAX],
              until.isoformat() if until else "", queue)


@dataclass(frozen=True)
class PauseFlag:
    queue: str
    by: str
    at: datetime | None
    note: str = ""
    until: datetime | None = None


@dataclass
class SwitchResult:
    """What a pause or resume did, queue by queue. `failed` maps a queue to why it did not change."""

    action: str
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    degraded: str = ""
    audit_error: str = ""
    record_error: str = ""  # the database's record of the change could not be written (state.py)

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def partial(self) -> bool:
        return bool(self.failed) and bool(self.changed)

    def summary(self) -> str:
        verb = "paused" if self.action == "pause" else "resumed"
        if not self.failed:
            text = f"{verb} {len(self.changed)} queue(s): {', '.join(self.changed) or 'none'}"
            if self.unchanged and self.action == "pause":
                text += (f"; already paused, so left as they were (their note and auto-resume time kept): "
                         f"{', '.join(self.unchanged)}")
            elif self.unchanged:
                text += f"; not paused, so left as they were: {', '.join(self.unchanged)}"
        else:
            failed = ", ".join(f"{queue} ({why})" for queue, why in self.failed.items())
            text = (f"{verb} {', '.join(self.changed) or 'nothing'} but FAILED at {failed}: "
                    f"{'the fleet is half paused' if self.action == 'pause' else 'those queues are still paused'}"
                    " — retry, or fix the key named above")
        if self.record_error:
            text += f" [{self.record_error}]"
        if self.degraded:
            text += f" [fleet view degraded: {self.degraded}]"
        return text



def _instant(value: str) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if value else None
    except ValueError:
        return None


def _flag(queue: str, raw: dict) -> PauseFlag:
    data = {text(k): text(v) for k, v in raw.items()}
    return PauseFlag(queue=queue, by=data.get("by", ""), at=_instant(data.get("at", "")), note=data.get("note", ""),
                     until=_instant(data.get("until", "")))


def parse_until(value: str | None, now: datetime | None = None) -> datetime | None:
    """An auto-resume time: ISO 8601 with a zone (or Z), in the future. ValueError says what is wrong."""
    if not value:
        return None
    now = now or timezone.now()
    try:
        until = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"--until {value!r} is not an ISO 8601 time (e.g. 2026-12-01T09:00:00+00:00)") from None
    if until.tzinfo is None:
        raise ValueError(f"--until {value!r} has no time zone: add +00:00 or Z")
    if until <= now:
        raise ValueError(f"--until {value!r} is not in the future")
    return until


def suggested_until(now: datetime | None = None) -> str:
    """An auto-resume time the pause dialog offers as its example: the next full hour but one, UTC, in the form
    parse_until reads (the page's script renews it when the dialog opens)."""
    soon = (now or timezone.now()).astimezone(UTC) + timedelta(hours=2)
    return soon.replace(minute=0, second=0, microsecond=0).isoformat()


def pause(redis, queues, *, by: str, note: str = "", until: datetime | None = None, degraded: str = "",
          now: datetime | None = None) -> SwitchResult:
    """Pause each queue that is not paused yet; one already paused keeps its pause as it is (who, when, note,
    until) and is reported unchanged. Per-queue results: a failure names exactly which queues changed."""
    now = now or timezone.now()
    queues = _checked(queues)
    # A pause past its auto-resume time ends first, so this one replaces it; without Redis, the pause itself
    # below says which queues it could not reach.
    with contextlib.suppress(RedisError):
        paused_among(redis, queues, now)
    result = SwitchResult("pause", degraded=degraded)
    pipe = redis.pipeline(transaction=False)
    for queue in queues:
        write_flag(pipe, queue, by=by, at=now, note=note, until=until)
    _collect(result, queues, pipe, lambda written: "changed" if written else "unchanged", replies_per_queue=1)
    # Recorded as Redis holds each flag: a queue paused already keeps its first pause's who, when, note, until.
    made = [PauseFlag(queue, by=by, at=now, note=(note or "")[:NOTE_MAX], until=until) for queue in result.changed]
    result.record_error = state.record_pauses(made + _kept_flags(redis, result.unchanged))
    _log_and_audit(result, by=by, note=note, until=until)
    return result


def resume(redis, queues, *, by: str, degraded: str = "", action: str = "resume") -> SwitchResult:
    queues = _checked(queues)
    result = SwitchResult("resume", degraded=degraded)
    pipe = redis.pipeline(transaction=False)
    for queue in queues:
        pipe.delete(flag_key(queue))
        pipe.srem(INDEX, queue)
    _collect(result, queues, pipe, lambda deleted, unindexed: "changed" if deleted or unindexed else "unchanged")
    result.record_error = state.forget_pauses(result.changed + result.unchanged)
    _log_and_audit(result, by=by, action=action)
    return result


def _kept_flags(redis, queues: list[str]) -> list[PauseFlag]:
    """The flags of queues that were paused already (unreadable ones are left out: their pause is Redis's)."""
    if not queues:
        return []
    pipe = redis.pipeline(transaction=False)
    for queue in queues:
        pipe.hgetall(flag_key(queue))
    try:
        replies = pipe.execute(raise_on_error=False)
    except RedisError:
        return []
    return [_flag(queue, raw) for queue, raw in zip(queues, replies, strict=True) if isinstance(raw, dict) and raw]


def _checked(queues) -> list[str]:
    queues = list(dict.fromkeys(queues))
    bad = [queue for queue in queues if not is_dispatch_queue(queue)]
    if bad:
        raise ValueError(f"not a pidispatch queue: {', '.join(bad)}")
    return queues


def _collect(result: SwitchResult, queues: list[str], pipe, verdict, replies_per_queue: int = 2) -> None:
    try:
        replies = pipe.execute(raise_on_error=False)
    except RedisError as exc:  # the connection itself failed: nothing is known to have changed
        for queue in queues:
            result.failed[queue] = type(exc).__name__
        return
    per_queue = [replies[index::replies_per_queue] for index in range(replies_per_queue)]
    for queue, *answers in zip(queues, *per_queue, strict=True):
        errors = [reply for reply in answers if isinstance(reply, Exception)]
        if errors:
            result.failed[queue] = _error_code(errors[0])
        elif verdict(*answers) == "changed":
            result.changed.append(queue)
        else:
            result.unchanged.append(queue)


def _error_code(error: Exception) -> str:
    """Redis's error code (WRONGTYPE, OOM, ...), also from inside a script, which wraps it in its own words."""
    words = str(error).replace(":", " ").split()
    return next((word for word in words if word.isupper() and len(word) > 2), "") or type(error).__name__


def _log_and_audit(result: SwitchResult, *, by: str, note: str = "", until=None, action: str = "") -> None:
    action = action or result.action
    logger.info("fleet_%s changed=%d unchanged=%d failed=%d queues=%s", action.replace("-", "_"),
                len(result.changed), len(result.unchanged), len(result.failed),
                ",".join(result.changed + list(result.failed)) or "-")
    if result.changed or result.failed:
        result.audit_error = audit.record(action, actor=by, queues=result.changed + list(result.failed), note=note,
                                          until=until, outcome=result.summary())


def read_flags(redis, now: datetime | None = None) -> dict[str, PauseFlag]:
    """Every pause in force, by queue. Flags past their `until` are cleared here (auto-resume). A Redis that lost its
    data is given the recorded pauses first (state.py)."""
    now = now or timezone.now()
    with contextlib.suppress(state.StateUnknown):
        state.ensure_restored(redis)
    names = sorted(text(name) for name in redis.smembers(INDEX))
    names = [name for name in names if is_dispatch_queue(name)]
    pipe = redis.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(flag_key(name))
    flags = {}
    for name, raw in zip(names, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(raw, Exception):
            flags[name] = _unreadable(name, raw)
        elif raw:
            flags[name] = _flag(name, raw)
    return _without_expired(redis, flags, now)


def _unreadable(queue: str, error: Exception) -> PauseFlag:
    """A flag key that cannot be read counts as a pause (a stop switch fails safe); resuming deletes it."""
    return PauseFlag(queue=queue, by="?", at=None,
                     note=f"pause flag unreadable ({str(error).split(' ', 1)[0]}): resume the queue to clear it")


def paused_among(redis, queues, now: datetime | None = None) -> set[str]:
    """The worker's check, once a second: which of its own queues are paused (one round trip)."""
    now = now or timezone.now()
    pipe = redis.pipeline(transaction=False)
    for queue in queues:
        pipe.hmget(flag_key(queue), "at", "until")
    flags = {}
    for queue, reply in zip(queues, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(reply, Exception):
            flags[queue] = _unreadable(queue, reply)
            continue
        at, until = reply
        if at is not None:
            flags[queue] = PauseFlag(queue=queue, by="", at=_instant(text(at)), until=_instant(text(until)))
    return set(_without_expired(redis, flags, now))


def _without_expired(redis, flags: dict[str, PauseFlag], now: datetime) -> dict[str, PauseFlag]:
    expired = [flag for flag in flags.values() if flag.until and flag.until <= now]
    cleared = []
    for flag in expired:
        if redis.eval(_EXPIRE_IF_UNCHANGED, 2, flag_key(flag.queue), INDEX, flag.until.isoformat(), flag.queue):
            cleared.append(flag.queue)
    if cleared:
        result = SwitchResult("resume", changed=cleared)
        result.record_error = state.forget_pauses(cleared, expired_by=now)
        _log_and_audit(result, by="auto-resume", action="auto-resume")
    return {queue: flag for queue, flag in flags.items() if flag not in expired}
