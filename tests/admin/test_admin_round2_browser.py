"""Issue 30's second round of the operator's pages, in a real browser (Playwright driving Debian's Chromium against
`live_server`): the trigger list in words, help texts that show their placeholders, a pause window's days as
checkboxes, a scoped limit refused without a per-run cap, breadcrumbs that do not repeat, the settings row as a
change page, the pause dialog inside its box with a future example and buttons of one size, and Start a run's
message linking the job. Screenshots are kept under test-results/."""

import time
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from apps.fleet import registry
from apps.receiver.models import Trigger
from apps.worker.models import PauseWindow, Run, ScopedLimit
from tests.browser_support import screenshot
from tests.conftest import ROOT

pytestmark = [pytest.mark.django_db(transaction=True)]

OUTPUT = ROOT / "test-results" / "test_admin_round2_browser"


def shot(page, name: str) -> None:
    screenshot(OUTPUT, page, name)


def crumbs(page) -> str:
    return " ".join(page.text_content("div.breadcrumbs").split())


def test_the_trigger_list_and_form_speak_words(operator_page, live_server):
    Trigger.objects.create(position=0, name="Review labelled PRs", kind="gitlab", on_type="label", label_any=["pi"],
                           flow="review", max_cost_usd=Decimal("0.5"))
    page = operator_page

    page.goto(f"{live_server.url}/admin/receiver/trigger/")
    headers = [" ".join(text.split()) for text in page.locator("#result_list thead th").all_text_contents()]
    assert [text for text in headers if text] == ["Order", "Name", "Forge", "Type", "Repositories", "Fires on",
                                                  "Flow", "Max cost", "Enabled", "Last fired", "Runs", "One-shot"]
    row = " ".join(page.text_content("#result_list tbody tr").split())
    assert "Review labelled PRs" in row and "$0.50" in row and "never" in row
    assert crumbs(page) == "Home › Intake › Triggers"
    shot(page, "trigger-list")

    page.goto(f"{live_server.url}/admin/receiver/trigger/add/")
    assert "pull/merge request gets a label" in page.text_content("#trigger-types")
    page.goto(f"{live_server.url}/admin/receiver/trigger/add/?on_type=label")
    help_text = page.text_content(".field-wait_for .help")
    assert "after <time with zone>, profile <check name>" in help_text  # shown, not swallowed as a tag
    shot(page, "trigger-form-help")


def test_a_pause_windows_days_are_ticked(operator_page, live_server):
    page = operator_page
    page.goto(f"{live_server.url}/admin/worker/pausewindow/add/")
    page.fill("#id_scope", "*")
    page.fill("#id_starts", "22:00")
    page.fill("#id_ends", "06:00")
    page.check("input[name=days][value=mon]")
    page.check("input[name=days][value=fri]")
    shot(page, "pause-window-days")
    page.click("input[name=_save]")
    page.wait_for_selector("ul.messagelist")

    assert PauseWindow.objects.get().days == ["mon", "fri"]
    assert "Mon, Fri" in page.text_content("#result_list")


def test_a_dollar_limit_without_a_per_run_cap_says_which_setting(operator_page, live_server, settings):
    settings.PI_MAX_COST_USD = ""
    page = operator_page
    page.goto(f"{live_server.url}/admin/worker/scopedlimit/add/")
    page.fill("#id_scope", "acme/web")
    page.fill("#id_day_usd", "5")
    page.click("input[name=_save]")
    page.wait_for_selector(".errorlist")

    assert "set “max cost per run” on the dispatch settings page (or PI_MAX_COST_USD)" in page.text_content(
        ".field-day_usd .errorlist")
    assert not ScopedLimit.objects.exists()
    shot(page, "scoped-limit-refused")


def test_breadcrumbs_say_each_step_once_and_the_settings_row_is_changed(operator_page, live_server):
    page = operator_page
    page.goto(f"{live_server.url}/admin/worker/run/")
    assert crumbs(page) == "Home › Runs"

    page.goto(f"{live_server.url}/admin/worker/dispatchsettings/")
    assert page.url.endswith("/admin/worker/dispatchsettings/1/change/")
    assert page.text_content("#content h1").strip() == "Change dispatch settings"
    assert crumbs(page) == "Home › Runs › Dispatch settings"  # the row named once
    shot(page, "settings-row")


def a_live_host(redis_conn) -> None:
    """hostA in the fleet's registry, serving the shared queue and its own (the fleet panel has buttons then)."""
    registry.publish(redis_conn, registry.HostFacts(name="hostA", declared=True, version="0.1.0", image="img"),
                     registry.ProcessFacts(worker_name="w-hostA", pid=1, proc="x/y/1/1", started_at=time.time(),
                                           queues=("pi-jobs", "pi-jobs@hostA")))


def box(page, selector: str) -> dict:
    return page.locator(selector).bounding_box()


def test_the_pause_dialog_fits_and_suggests_a_future_time_and_buttons_have_one_size(
        operator_page, live_server, redis_conn):
    a_live_host(redis_conn)
    page = operator_page
    page.goto(f"{live_server.url}/admin/fleet/")
    page.wait_for_selector("#fleet-state")

    heights = {round(b["height"])
               for b in (button.bounding_box() for button in page.locator("#content-main .button").all())
               if b is not None}
    assert len(heights) == 1, heights

    page.click("#fleet-pause-all-open")
    dialog = box(page, "dialog#fleet-pause-all")
    for field in ("#fleet-pause-note", "#fleet-pause-until"):
        inside = box(page, field)
        assert dialog["x"] <= inside["x"] and inside["x"] + inside["width"] <= dialog["x"] + dialog["width"], field
    example = page.get_attribute("#fleet-pause-until", "placeholder")
    assert datetime.fromisoformat(example) > timezone.now() + timedelta(minutes=30)
    dialog_heights = {round(button.bounding_box()["height"]) for button in page.locator("dialog .button").all()}
    assert dialog_heights == heights
    shot(page, "pause-dialog")


def test_start_a_runs_message_links_the_job(operator_page, live_server, settings):
    settings.GITHUB_TOKEN = "ghp-x"
    page = operator_page
    page.click("#link-start-run")
    page.wait_for_selector("#start-run")
    page.fill("#id_repository", "acme/web")
    page.fill("#id_number", "7")
    page.fill("#id_flow", "fix-bug")
    page.click("#start-run-submit")
    page.wait_for_selector("#started-job")

    job_id = page.text_content("#started-job")
    page.click("#started-job")
    page.wait_for_selector("#changelist")
    assert f"job_id={job_id}" in page.url


BUTTONS = ("#content .button, #content input[type=submit], #content input[type=button], #content a.button, "
           "#content .actions button, #content .submit-row a.deletelink, #content .submit-row a.closelink")


def button_heights(page) -> dict[int, list[str]]:
    """Each visible button's height on the page, with what it says (to name the odd one out)."""
    found: dict[int, list[str]] = {}
    for button in page.locator(BUTTONS).all():
        if (where := button.bounding_box()) is None:
            continue  # hidden (a closed dialog's)
        label = " ".join((button.text_content() or button.get_attribute("value") or "").split())
        found.setdefault(round(where["height"]), []).append(label)
    return found


def test_every_pages_buttons_have_one_size(operator_page, live_server, label_trigger, redis_conn):
    a_live_host(redis_conn)
    now = timezone.now()
    run = Run.objects.create(job_id="gh-buttons-1", attempt=1, kind="github", target="acme/web#7",
                             scope="github:acme/web", flow="fix-bug", host="hostA", queue="pi-jobs",
                             trigger=label_trigger, trigger_type="label", started_at=now - timedelta(minutes=3),
                             ended_at=now, outcome="failed", reason="runner-infra", turns=3, tokens_total=7440)
    window = PauseWindow.objects.create(scope="*", starts="22:00", ends="06:00", days=["mon"])
    page = operator_page
    pages = {
        "home": "/admin/", "runs": "/admin/worker/run/", "run": f"/admin/worker/run/{run.pk}/change/",
        "triggers": "/admin/receiver/trigger/", "trigger": f"/admin/receiver/trigger/{label_trigger.pk}/change/",
        "trigger-delete": f"/admin/receiver/trigger/{label_trigger.pk}/delete/",
        "pause-window": f"/admin/worker/pausewindow/{window.pk}/change/", "settings": "/admin/worker/dispatchsettings/",
        "start-run": "/admin/start-run/", "fleet": "/admin/fleet/", "costs": "/admin/insight/spend/",
        "deliveries": "/admin/receiver/delivery/",
    }
    sizes: dict[int, list[str]] = {}
    for name, path in pages.items():
        page.goto(f"{live_server.url}{path}")
        for height, labels in button_heights(page).items():
            sizes.setdefault(height, []).extend(f"{name}: {label}" for label in labels)
    assert len(sizes) == 1, sizes  # one height, whichever page
    assert sum(len(labels) for labels in sizes.values()) >= 15  # the pages above have that many at least

    # The changelist's toolbar lines up with its buttons.
    page.goto(f"{live_server.url}/admin/worker/run/")
    (height,) = sizes
    assert round(box(page, "#searchbar")["height"]) == height
    shot(page, "runs-list-buttons")
