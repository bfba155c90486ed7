"""`manage.py check` (and so every worker start) refuses a bound out of range, which would turn it upside
down: a negative disk limit would stop every job, a zero recheck would spin."""

import pytest

from apps.worker.gates.checks import BOUNDS, bounds_settings


def test_the_defaults_pass():
    assert bounds_settings(None) == []


@pytest.mark.parametrize("name, value", [("PI_JOB_DISK_MB", -1), ("PI_JOB_DISK_POLL_SECONDS", 0),
                                         ("PI_REDIS_OUTAGE_SECONDS", -5), ("PI_DATABASE_RECHECK_SECONDS", 0),
                                         ("PI_WAIT_CHECK_SLOTS", 0), ("PI_WAIT_THROTTLE_SECONDS", 0),
                                         # housekeeping's retentions (0 days would prune today's runs)
                                         ("PI_RUN_RETENTION_DAYS", 0), ("PI_DELIVERY_RETENTION_DAYS", 6)])
def test_a_bound_out_of_range_fails_the_check(settings, name, value):
    setattr(settings, name, value)
    (problem,) = bounds_settings(None)
    assert (problem.id, problem.msg) == ("worker.E009", f"{name} must be at least {BOUNDS[name]}, not {value}.")
