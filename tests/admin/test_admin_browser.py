"""The operator's pages in a real browser (Playwright driving Debian's Chromium against `live_server`): the
front page and its status strip, a failed run explained, the run list at 1366 px, the inbox's job states,
the trigger form type by type, and Start a run. Screenshots are kept under test-results/."""

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.fleet import pauses
from apps.receiver.models import Delivery, Trigger
from apps.worker import reasons, spend
from apps.worker.models import Run
from tests.browser_support import screenshot
from tests.conftest import ROOT

pytestmark = [pytest.mark.django_db(transaction=True)]

OUTPUT = ROOT / "test-results" / "test_admin_browser"


def shot(page, name: str) -> None:
    screenshot(OUTPUT, page, name)


def failed_twice(trigger=None):
    now = timezone.now()
    # Both attempts inside today's window, also just after midnight ("failed today" counts them).
    earliest = max(now - timedelta(minutes=10), spend.windows(now)["day"])
    step = (now - earliest) / 4
    runs = []
    for attempt, reason in ((1, "runner-infra"), (2, "container-exit-unknown")):
        runs.append(Run.objects.create(
            job_id="gh-" + "8f3c" * 12 + "-r1", attempt=attempt, kind="github", target="acme/web#7",
            scope="github:acme/web", flow="fix-bug", host="hostA", queue="pi-jobs", trigger=trigger,
            trigger_type="label", delivery_id="d-browser", started_at=earliest + step * (2 * attempt - 2),
            ended_at=earliest + step * (2 * attempt - 1), outcome="failed", reason=reason, exit_code=3,
            turns=3, tokens_total=7440, cost="0.00420000000000000"))
    return runs


def test_the_front_page_says_what_state_the_system_is_in(operator_page, live_server, redis_conn):
    page = operator_page
    assert "Django administration" not in page.content()
    assert page.text_content("#strip-fleet .big").strip() == "RUNNING"
    shot(page, "index-running")

    pauses.pause(redis_conn, ["pi-jobs"], by="operator", note="provider outage")
    failed_twice()
    page.reload()
    assert page.text_content("#strip-fleet .big").strip() == "PAUSED"
    assert "paused by operator: “provider outage”" in page.text_content("#strip-fleet")
    assert "1 failed today" in page.text_content("#strip-jobs")
    labels = page.eval_on_selector_all("#content-main .module caption a", "els => els.map(e => e.textContent)")
    assert (labels.index("Fleet") < labels.index("Runs") < labels.index("Intake")
            < labels.index("Authentication and Authorization"))
    shot(page, "index-paused")

    page.click("#strip-jobs a")
    page.wait_for_selector("#result_list")
    assert "outcome=failed" in page.url


def test_a_failed_run_is_explained_and_the_list_fits_1366_px(operator_page, live_server, label_trigger):
    first, second = failed_twice(label_trigger)
    Delivery.objects.create(forge="github", delivery_id="d-browser", event="issues", status="queued",
                            job_ids=[second.job_id])
    page = operator_page
    page.set_viewport_size({"width": 1366, "height": 900})
    page.goto(f"{live_server.url}/admin/worker/run/")
    assert page.evaluate("document.documentElement.scrollWidth") <= 1366
    widths = page.evaluate("[...document.querySelectorAll('#result_list thead th')]"
                           ".map(t => t.className + ':' + t.offsetWidth)")
    assert page.evaluate("(r => r.scrollWidth <= r.clientWidth)(document.querySelector('#changelist .results'))"), (
        " ".join(widths),
        page.evaluate("(r => [r.scrollWidth, r.clientWidth])(document.querySelector('#changelist .results'))"))
    assert "2 of 2, retried after runner-infra" in page.text_content("#result_list")
    hover = page.get_attribute("#result_list tr:first-child .reason", "title")
    assert hover.startswith(reasons.explain("container-exit-unknown").means)
    job_cell = page.locator("#result_list tr:first-child .job-id")
    assert job_cell.get_attribute("title") == second.job_id and "…" in job_cell.text_content()
    assert "$0.0042" in page.text_content("#result_list")
    shot(page, "run-list-1366")

    page.goto(f"{live_server.url}/admin/worker/run/{second.pk}/change/")
    assert reasons.explain("container-exit-unknown").means in page.text_content(".field-explanation")
    assert "Failed:" in page.text_content(".field-forge_sentence")
    page.click(".field-attempts_display a:has-text('attempt 1')")
    page.wait_for_url(f"**/admin/worker/run/{first.pk}/change/")
    assert "posts no status sentence" in page.text_content(".field-forge_sentence")
    page.goto(f"{live_server.url}/admin/worker/run/{second.pk}/change/")
    shot(page, "run-page-failed")
    page.click(".field-delivery_display a")
    page.wait_for_selector(".field-jobs")
    assert "failed (container-exit-unknown)" in page.text_content(".field-jobs")
    shot(page, "delivery-page")


def test_a_person_fills_in_a_label_trigger(operator_page, live_server):
    page = operator_page
    page.goto(f"{live_server.url}/admin/receiver/trigger/add/")
    shot(page, "trigger-choose-type")
    page.click("a[data-type=label]")
    page.wait_for_selector("#id_label_any")
    assert not page.is_visible("#id_cron_pattern") and page.query_selector("#id_cron_pattern") is None
    assert page.input_value("#id_label_any") == ""
    assert "Labels, any of" in page.content()

    page.fill("#id_label_any", '["pi", ')
    page.fill("#id_flow", "fix-bug")
    page.click("input[name=_save]")
    page.wait_for_selector(".errorlist")
    errors = page.eval_on_selector_all(".errorlist li", "els => els.map(e => e.textContent)")
    assert len(errors) == 1 and "Labels, any of" in errors[0] and "e.g. pi, urgent" in errors[0]
    shot(page, "trigger-one-error")

    page.fill("#id_label_any", "pi, urgent")
    page.click("input[name=_save]")
    page.wait_for_selector("ul.messagelist")
    assert Trigger.objects.get().label_any == ["pi", "urgent"]
    shot(page, "trigger-list")


def test_start_a_run_shows_the_side_picked_and_the_services_refusal(operator_page, live_server, settings):
    settings.GITHUB_TOKEN = "ghp-x"
    page = operator_page
    page.click("#link-start-run")
    page.wait_for_selector("#start-run")
    assert page.is_visible("#id_repository") and not page.is_visible("#id_folder")
    page.check("input[name=where][value=local]")
    assert page.is_visible("#id_folder") and not page.is_visible("#id_repository")
    page.check("input[name=where][value=cron]")  # a cron trigger brings its own task, model and limits
    assert page.is_visible("#id_cron_trigger") and page.is_visible("#id_cron_host")
    assert not page.is_visible("#id_folder") and not page.is_visible("#id_task") and not page.is_visible("#id_model")
    page.fill("#id_cron_trigger", "no-such-schedule")
    page.click("#start-run-submit")
    page.wait_for_selector(".field-cron_trigger .errorlist")
    assert "no cron trigger has the id 'no-such-schedule'" in page.text_content(".field-cron_trigger .errorlist")
    assert page.is_visible("#id_cron_trigger")  # the page comes back on the side that was picked
    page.check("input[name=where][value=forge]")
    page.fill("#id_repository", "acme/web")
    page.fill("#id_number", "7")
    page.fill("#id_flow", "Not A Flow")
    page.click("#start-run-submit")
    page.wait_for_selector(".field-flow .errorlist")
    assert "use 1-64 lowercase letters" in page.text_content(".field-flow .errorlist")
    shot(page, "start-run-refused")
    page.fill("#id_flow", "fix-bug")
    page.click("#start-run-submit")
    page.wait_for_selector("ul.messagelist")
    assert "Queued run-" in page.text_content("ul.messagelist")
    shot(page, "start-run-queued")
