"""The gate ladder and what it consults, in the order a job meets them (`ladder.run_gates`).

    ladder.py            the ladder itself: every gate in order, the one place a job is refused, deferred or run
    verdicts.py          what a gate or a run concludes (outcome, reason, telemetry, publication)
    runtime_settings.py  the settings overlay: environment, then the admin's live row, then the job
    quiet_hours.py       pause windows
    scopes.py            the scope a job counts against (repository, folder) and its scoped limits
    deployment_caps.py   the deployment's own caps as they apply now (what the cost page and `spend` show)
    budget.py, money.py  job-count, token and dollar windows (reserve before spend, settle after)
    leases.py            concurrency leases: scope, folder, host slots (host_slots.py), wait-check slots (wait_slots.py)
    waitfor.py, checks.py  held jobs and their check scripts (`run.waitFor`)
    secrets.py           secret references and their resolvers; reserved names
    hostscripts.py       running a host's scripts in a closed environment
"""
