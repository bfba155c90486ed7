"""Scoped limits, pause windows and the settings row in the admin: a dollar window without a per-run cap is refused
at save (naming the setting), the list shows the dollar columns, a refused run links the limit that refused it;
a pause window's days are checkboxes; help texts render as text."""

import re
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from apps.worker.gates import budget
from apps.worker.models import DispatchSettings, Outcome, PauseWindow, Run, ScopedLimit
from tests.jobspecs import enqueue_spec, forge_spec

pytestmark = pytest.mark.django_db(transaction=True)

LIMIT_ADD = "/admin/worker/scopedlimit/add/"
WINDOW_ADD = "/admin/worker/pausewindow/add/"


def test_a_dollar_window_without_any_per_run_cap_is_refused_naming_the_setting(admin_client, settings):
    settings.PI_MAX_COST_USD = ""

    page = admin_client.post(LIMIT_ADD, {"scope": "acme/web", "day_usd": "5", "note": ""}).content.decode()

    assert "a dollar window needs a per-run cap" in page and "max cost per run" in page and "PI_MAX_COST_USD" in page
    assert not ScopedLimit.objects.exists()
    # A run-count limit needs no dollar cap.
    assert admin_client.post(LIMIT_ADD, {"scope": "acme/api", "day": "3", "note": ""}).status_code == 302


def test_the_settings_rows_per_run_cap_is_enough_and_then_cannot_be_cleared(admin_client, settings):
    settings.PI_MAX_COST_USD = ""
    DispatchSettings.objects.create(max_cost_usd=Decimal("0.5"))

    assert admin_client.post(LIMIT_ADD, {"scope": "acme/web", "day_usd": "5", "note": ""}).status_code == 302

    page = admin_client.post("/admin/worker/dispatchsettings/1/change/", {"max_cost_usd": "", "job_memory": ""})
    assert "the scoped limit for acme/web has a dollar window" in page.content.decode()
    assert DispatchSettings.objects.get().max_cost_usd == Decimal("0.5")


def test_the_limit_list_shows_the_dollar_columns(admin_client, settings):
    settings.PI_MAX_COST_USD = "1"
    ScopedLimit.objects.create(scope="acme/web", day=4, week_usd=Decimal("12.5"), month_usd=Decimal("0.25"))

    page = admin_client.get("/admin/worker/scopedlimit/").content.decode()

    for header in ("Day $", "Week $", "Month $"):
        assert f">{header}<" in page, header
    assert "$12.50" in page and "$0.25" in page


def test_a_run_refused_by_a_scoped_limit_names_and_links_it(admin_client, run_worker, redis_conn):
    limit = ScopedLimit.objects.create(scope="acme/web", day=1)
    # Today's one run of acme/web is already taken.
    redis_conn.set(budget.window_keys(f"s:{budget.scope_hash('acme/web')}", timezone.now())["day"], 1)
    job_id = enqueue_spec(forge_spec("gh-limited"))

    run_worker("pi-jobs")

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason, run.refused_by_limit) == (Outcome.POLICY, "scope-cap", limit)
    page = admin_client.get(f"/admin/worker/run/{run.pk}/change/").content.decode()
    assert f'href="/admin/worker/scopedlimit/{limit.pk}/change/">acme/web</a>' in page


def test_other_refusals_name_no_limit(run_worker, settings):
    ScopedLimit.objects.create(scope="acme/web", day=5)
    job_id = enqueue_spec(forge_spec("gh-unlimited"))
    run_worker("pi-jobs", env_overrides={"PI_DAILY_CAP": "1", "PI_SOFT_HOLD_PCT": "1"})

    run = Run.objects.get(job_id=job_id)
    assert run.reason == "soft-hold" and run.refused_by_limit is None


def test_a_pause_windows_days_are_checkboxes_saved_in_week_order(admin_client):
    form = admin_client.get(WINDOW_ADD).content.decode()
    assert 'type="checkbox" name="days" value="mon"' in form and "<textarea" not in form.split('name="days"')[0][-300:]

    response = admin_client.post(WINDOW_ADD, {"scope": "*", "starts": "22:00", "ends": "06:00", "tz": "UTC",
                                              "days": ["fri", "mon"], "enabled": "on", "note": ""})

    assert response.status_code == 302
    window = PauseWindow.objects.get()
    assert window.days == ["mon", "fri"]
    page = admin_client.get(f"/admin/worker/pausewindow/{window.pk}/change/").content.decode()
    ticked = re.findall(r'<input type="checkbox" name="days" value="(\w+)"[^>]*\bchecked', page)
    assert ticked == ["mon", "fri"]
    assert "Mon, Fri" in admin_client.get("/admin/worker/pausewindow/").content.decode()


def test_no_days_ticked_is_every_day(admin_client):
    response = admin_client.post(WINDOW_ADD, {"scope": "*", "starts": "01:00", "ends": "02:00", "tz": "UTC",
                                              "enabled": "on", "note": ""})
    assert response.status_code == 302 and PauseWindow.objects.get().days == []
    assert "every day" in admin_client.get("/admin/worker/pausewindow/").content.decode()


def test_a_limit_refused_at_save_by_the_model_too(settings):
    """The importer and the API call full_clean: the same refusal."""
    settings.PI_MAX_COST_USD = ""
    with pytest.raises(ValidationError, match="needs a per-run cap"):
        ScopedLimit(scope="acme/web", month_usd=Decimal("3")).full_clean()


def test_help_texts_render_as_text(admin_client):
    page = admin_client.get("/admin/receiver/trigger/add/?on_type=label").content.decode()
    assert "after &lt;time with zone&gt;, profile &lt;check name&gt;" in page
    assert "<time with zone>" not in page


def test_a_weekday_window_gate_still_reads_the_saved_days():
    from apps.worker.gates.quiet_hours import paused_until

    PauseWindow.objects.create(scope="*", starts="00:00", ends="23:59", tz="UTC", days=["mon"])
    window = PauseWindow.objects.get()
    monday = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    assert paused_until([window], ["*"], monday) is not None
    assert paused_until([window], ["*"], monday.replace(day=1, month=12)) is None
