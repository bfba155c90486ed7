"""The worker process: RQ's worker with pidispatch's duties.

    rqworker         the worker class (`manage.py rqworker`): its beat, the boot reaper, the sweeps, shutdown
    worker_presence  this process's row in the fleet's host registry
    worker_cancel    acknowledging and carrying out a fleet cancel of the job this process runs
    worker_lost      jobs whose worker died: found by any live worker's sweep, recorded, retried or not
    redis_outage     riding out a Redis outage while a job runs
"""
