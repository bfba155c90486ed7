"""Venues (`run.backend`, PI_BACKENDS; issue 29 §3): a job runs only on a venue its host blesses, and a blessed venue
this worker cannot run is refused, never quietly run on Docker instead. Both before any spend."""

import pytest

from apps.worker.models import Outcome, Run
from apps.worker.sandbox import venues
from tests.jobspecs import enqueue_spec, forge_spec, local_spec

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_refusal_for_each_venue_and_blessing(settings):
    settings.PI_BACKENDS = ("local",)
    assert venues.refusal("") is None and venues.refusal("local") is None
    assert venues.refusal("podman") == ("backend-unblessed", "not-in-PI_BACKENDS")
    settings.PI_BACKENDS = ("local", "podman")
    assert venues.refusal("podman") == ("backend-unavailable", "podman-not-implemented")
    settings.PI_BACKENDS = ("podman",)
    assert venues.refusal("")[0] == "backend-unblessed"  # the default venue needs its blessing too


@pytest.mark.parametrize("blessed, backend, reason", [
    ("local", "podman", "backend-unblessed"),
    ("local,podman", "podman", "backend-unavailable"),
    ("podman", "", "backend-unblessed"),
])
def test_a_job_on_a_venue_its_host_cannot_run_is_refused_before_it_spends(repo, run_worker, blessed, backend,
                                                                           reason):
    local = enqueue_spec(local_spec("run-venue-local", str(repo), backend=backend))
    forge = enqueue_spec(forge_spec("gh-venue-forge", backend=backend))

    run_worker("pi-jobs", env_overrides={"PI_BACKENDS": blessed})

    for job_id in (local, forge):
        run = Run.objects.get(job_id=job_id)
        assert (run.outcome, run.reason, run.budget_reserved) == (Outcome.POLICY, reason, False)


def test_a_job_on_the_blessed_local_venue_runs(repo, run_worker):
    job_id = enqueue_spec(local_spec("run-venue-ok", str(repo), backend="local"))
    run_worker("pi-jobs", env_overrides={"PI_BACKENDS": "local,podman"})
    assert Run.objects.get(job_id=job_id).outcome == Outcome.COMPLETED


def test_manage_py_check_names_an_unknown_venue_and_a_missing_overlay(settings, tmp_path):
    from apps.worker.gates.checks import overlay_and_venue_settings

    settings.PI_BACKENDS, settings.PI_GLOBAL_PI_DIR = ("local", "dockr"), str(tmp_path / "absent")
    found = {problem.id: problem.msg for problem in overlay_and_venue_settings(None)}
    assert "dockr" in found["worker.E015"] and "jobs here run without the overlay" in found["worker.W004"]
    settings.PI_BACKENDS, settings.PI_GLOBAL_PI_DIR = ("local", "podman"), str(tmp_path)
    assert overlay_and_venue_settings(None) == []
