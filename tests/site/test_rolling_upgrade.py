"""A rolling upgrade runs two releases against one database: hosts still on the previous release keep writing
while the migrations of this one are applied (docs/deploying.md, contrib/upgrade.sh). So every table the previous
release writes must accept its rows as it wrote them: a new column is nullable or has a database default, never
only a Python one. Checked for real: the previous release's models, rebuilt from the migration graph, write into a
database migrated to this release."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

# Each app's last migration in the previous release (CHANGELOG.md). Move it forward at every release.
PREVIOUS_RELEASE = {"worker": "0009_field_validators", "fleet": "0002_failed_job_actions",
                    "receiver": "0007_trigger_max_cost_usd", "access": "0001_initial", "insight": "0001_initial"}


def previous_models():
    executor = MigrationExecutor(connection)
    return executor.loader.project_state(list(PREVIOUS_RELEASE.items())).apps


def test_the_previous_release_can_record_a_run_and_its_log():
    from django.utils import timezone

    old = previous_models()
    now = timezone.now()
    run = old.get_model("worker", "Run").objects.create(
        job_id="gh-old-release", kind="github", started_at=now, ended_at=now, outcome="completed")
    old.get_model("worker", "RunLog").objects.create(run_id=run.pk, created_at=now)

    from apps.worker.models import Run

    assert Run.objects.get(job_id="gh-old-release").outcome == "completed"  # and this release reads it


@pytest.mark.parametrize("app_label, model", [("receiver", "Delivery"), ("receiver", "Trigger"),
                                              ("fleet", "FleetAction"), ("worker", "ScopedLimit"),
                                              ("worker", "DispatchSettings"), ("worker", "PauseWindow")])
def test_the_previous_release_can_write_every_table_it_writes(app_label, model):
    from django.utils import timezone

    old = previous_models().get_model(app_label, model)
    required = {"Delivery": {"forge": "github", "delivery_id": "d-old"},
                "Trigger": {"kind": "github", "position": 99},
                "FleetAction": {"action": "pause", "actor": "cli:old", "outcome": "paused"},
                "ScopedLimit": {"scope": "acme/old"},
                "DispatchSettings": {"pk": 1},
                "PauseWindow": {"scope": "acme/old", "starts": "01:00", "ends": "02:00", "days": []}}[model]
    if model == "FleetAction":
        required["at"] = timezone.now()
    old.objects.update_or_create(**required) if model == "DispatchSettings" else old.objects.create(**required)
