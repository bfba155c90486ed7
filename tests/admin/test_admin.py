"""The operator's view: triggers and run history in the Django admin."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from apps.receiver.models import Trigger
from apps.worker.models import DispatchSettings, Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def finished_run(label_trigger):
    started = timezone.now() - timedelta(seconds=42)
    return Run.objects.create(
        job_id="gh-admin-1", kind="github", target="acme/web#7", scope="github:acme/web", flow="fix-bug",
        trigger=label_trigger, trigger_type="label", delivery_id="admin-1", host="hostA", queue="pi-jobs",
        image="pidispatch-demo:latest", started_at=started, ended_at=started + timedelta(seconds=12.5),
        outcome="completed", exit_code=0, turns=4, tokens_in=1200, tokens_out=345, tokens_total=1545,
        cost=Decimal("0.0123"), usage={"models": [{"provider": "fake", "model": "fake-1"}]}, budget_reserved=True,
    )


def test_run_list_shows_what_an_operator_scans_for(admin_client, finished_run):
    page = admin_client.get("/admin/worker/run/").content.decode()

    for text in ("gh-admin-1", "acme/web#7", "fix-bug", "completed", "hostA", "12.5 s", "1545", "$0.0123"):
        assert text in page


def test_run_list_filters_by_outcome(admin_client, finished_run):
    Run.objects.create(job_id="gh-admin-2", kind="github", target="acme/web#8", started_at=timezone.now(),
                       ended_at=timezone.now(), outcome="policy", reason="job-image-missing")

    page = admin_client.get("/admin/worker/run/?outcome=policy").content.decode()

    assert "gh-admin-2" in page and "gh-admin-1" not in page


def test_run_detail_shows_every_recorded_field(admin_client, finished_run):
    page = admin_client.get(f"/admin/worker/run/{finished_run.pk}/change/").content.decode()

    readable = {"target", "cost", "usage", "started_at", "ended_at", "delivery_id", "publish_url", "lost_retry",
                "parent_job_id", "chain_children", "chain_refusals", "sandbox_until", "resumed"}
    said_by = {"resume_reason": "resumed_display",  # "no: <why> (<token>)" in the resumed line
               "refused_by_limit": "refused_by_limit_display"}  # the limit's scope, linked to its page
    for field in Run._meta.fields:
        if field.name != "id":
            name = f"{field.name.removesuffix('_at').removesuffix('_id').removesuffix('_url')}_display" \
                if field.name in readable else said_by.get(field.name, field.name)
            assert f"field-{name}" in page, field.name
    assert "fake-1" in page and "admin-1" in page


def test_runs_are_append_only_in_the_admin(admin_client, finished_run):
    assert admin_client.get("/admin/worker/run/add/").status_code == 403
    assert admin_client.post(f"/admin/worker/run/{finished_run.pk}/delete/").status_code == 403
    assert Run.objects.filter(pk=finished_run.pk).exists()


def test_trigger_admin_creates_a_valid_rule_and_explains_a_bad_one(admin_client):
    ok = admin_client.post("/admin/receiver/trigger/add/", {
        "position": 1, "enabled": "on", "on_type": "label", "label_any": '["pi"]', "label_all": "[]",
        "label_none": '["wontfix"]', "kind": "github", "flow": "fix-bug", "note": "",
    })
    assert ok.status_code == 302
    assert Trigger.objects.get().label_none == ["wontfix"]

    bad = admin_client.post("/admin/receiver/trigger/add/", {
        "position": 2, "on_type": "label", "label_any": "[]", "label_all": "[]", "label_none": '["x"]',
        "kind": "github", "flow": "Not A Flow", "note": "",
    })
    page = bad.content.decode()
    assert bad.status_code == 200
    assert "needs at least one positive selector" in page
    assert "“Flow” must be 1-64 lowercase letters" in page
    assert Trigger.objects.count() == 1


def test_trigger_list_summarises_the_predicate(admin_client, label_trigger):
    page = admin_client.get("/admin/receiver/trigger/").content.decode()
    assert "any: pi" in page and "fix-bug" in page


def test_settings_page_shows_the_values_in_effect_and_refuses_bad_input(admin_client, settings):
    settings.PI_DAILY_CAP = 25
    first = admin_client.get("/admin/worker/dispatchsettings/", follow=True)
    # No row yet: still its change page, never "Add" (the first save writes the row).
    assert first.redirect_chain[-1][0] == "/admin/worker/dispatchsettings/1/change/"
    page = first.content.decode()
    assert "daily cap: 25" in page and "Change dispatch settings" in page and "Add dispatch" not in page
    assert not DispatchSettings.objects.exists()

    bad = admin_client.post("/admin/worker/dispatchsettings/1/change/", {"soft_hold_pct": 150, "job_memory": "lots"})
    assert "must be between 1 and 99" in bad.content.decode() and "like 512m or 4g" in bad.content.decode()

    admin_client.post("/admin/worker/dispatchsettings/1/change/", {"daily_cap": 3, "job_memory": ""})
    assert "daily cap: 3" in admin_client.get("/admin/worker/dispatchsettings/", follow=True).content.decode()
    admin_client.post("/admin/worker/dispatchsettings/1/change/", {"daily_cap": 4, "job_memory": ""})
    assert "daily cap: 4" in admin_client.get("/admin/worker/dispatchsettings/1/change/").content.decode()


def test_pause_windows_and_limits_are_editable_with_field_errors(admin_client):
    from apps.worker.models import PauseWindow, ScopedLimit

    created = admin_client.post("/admin/worker/pausewindow/add/", {
        "scope": "github:acme/web", "enabled": "on", "starts": "22:00", "ends": "06:00", "tz": "Europe/Amsterdam",
        "days": ["fri"], "note": "",  # the days are checkboxes
    })
    assert created.status_code == 302 and PauseWindow.objects.get().days == ["fri"]
    assert "22:00-06:00 (overnight)" in admin_client.get("/admin/worker/pausewindow/").content.decode()

    refused = admin_client.post("/admin/worker/scopedlimit/add/", {"scope": "acme/*", "note": ""})
    page = refused.content.decode()
    assert "globs are not supported" in page and "set at least one of day" in page
    assert not ScopedLimit.objects.exists()


def test_run_filters_offer_recent_values_and_filter(admin_client, finished_run):
    Run.objects.create(job_id="gh-old", kind="gitlab", target="g/p#1", host="retired-host",
                             started_at=timezone.now() - timedelta(days=90),
                             ended_at=timezone.now() - timedelta(days=90), outcome="policy", reason="scope-cap")
    page = admin_client.get("/admin/worker/run/").content.decode()
    assert "?host=hostA" in page and "?host=retired-host" not in page  # only the last 30 days are offered
    assert "?kind=azure" in page  # kinds are a fixed list

    assert "gh-old" in admin_client.get("/admin/worker/run/?host=retired-host").content.decode()  # still filterable
    filtered = admin_client.get("/admin/worker/run/?kind=gitlab").content.decode()
    assert "gh-old" in filtered and "gh-admin-1" not in filtered
