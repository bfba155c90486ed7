"""Agent sessions: a `run.resume` trigger's follow-up continues pi's conversation on the same target.

A session belongs to one trigger on one target: a forge, a repository and an issue or pull request
(`trigger:3:github:acme/web#7`), or a cron trigger's own id. Two triggers on one issue keep two sessions: one may
run for people of other standing than the other, and neither job reads what the other's agent wrote. A job whose
trigger says `run.resume: true`:

1. before its container, checks out the target's kept session (`store.checkout`): a copy of the transcript is
   written to the job's own `session/` folder, which the container sees read-write at `/session`; the runner then
   starts pi with `--session /session/session.jsonl` instead of `--no-session` (pi 0.73.1 opens that file when it
   is there and starts a new session at that path when it is not, so the first job on a target writes one);
2. when its run completes (exit 0; any other end keeps the earlier session as it was), promotes the transcript pi
   left there (`store.promote`): read without following links, bounded by PI_SESSION_MAX_BYTES, cut to the turns
   pi itself could have written (transcript.py: a user turn is this job's prompt or was kept before), scrubbed of the
   provider key and the job's forge tokens as run logs are (apps/worker/scrubbing.py), compressed, and written over
   the target's row with a fresh expiry (PI_SESSION_TTL_DAYS).

A pull request from a fork never gets a session, nor keeps one (its author could otherwise read what the agent
did for the repository's own people, or plant turns for the next job). The Run records `resumed` and, when it did
not resume, `resume_reason`: `no-session`, `session-expired`, `session-too-large`, `fork`, `store-unavailable`.

Where the sessions live: the database (`AgentSession`), not Django's storage API. A resumed job may run on any
host of the fleet, and the database is the one store every host is already guaranteed to share (a multi-host
deployment runs on PostgreSQL): the storage API's file default would be per host and silently break cross-host
resume until an operator configured an object store. A session is bounded (8 MiB by default, compressed in the
row), there is one row per active target and it expires, so the database carries it easily; promotion is one
upsert in one transaction, and expiry one indexed delete. A store that does not answer never stops the job: it
runs cold (`store-unavailable`) and its session is not kept.
"""
