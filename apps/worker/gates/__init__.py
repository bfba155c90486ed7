"""The gate ladder and what it consults, in the order a job meets them (`ladder.GATES`).

    ladder.py            the ladder itself: GATES, every gate in order, and the one place its stops are caught
    attempt.py           one climb: what the gates found, and what it holds until it lets go
    steps.py             the gates before the container, one function each
    container_step.py    the container behind its gateway, publishing, chaining; what an exit code means
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
