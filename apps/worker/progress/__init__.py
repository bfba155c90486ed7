"""Where a job is while it runs: the worker writes each phase it reaches into Redis, the job's live page reads it.

    progress = tracker.start(spec.job_id, host=..., attempt=...)   # the work horse, as the climb begins
    progress.passed("workspace")                                   # each gate passed, with its time
    ticker = tracker.Ticker(progress, meter=..., log=...)           # while the container runs: tokens, output
    progress.ended(outcome, reason)                                 # once the run is recorded (or deferred)

    reading.live(job_id, user)   # the page's JSON: RQ's word for the job, its phases, its usage, its output

Redis holds it, never the database: it is a view of work in flight, with a TTL (the job's timeout while it runs,
ten minutes once it ended). Ids, phase tokens, times and numbers only; the container's output (issue
text, the agent's words) only with PI_CAPTURE_JOB_LOGS, scrubbed as its kept log is, and read only with
`worker.view_run_log`. A Redis fault here never touches the job: the page then says less.
"""
