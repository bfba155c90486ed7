"""The fleet panel in a real browser (Playwright driving Debian's Chromium against `live_server`): log in,
pause a queue and see PART PAUSED, resume and see RUNNING, watch it refresh itself without a reload,
and keep a screenshot under test-results/."""

import time
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from apps.fleet import pauses, registry
from tests.conftest import ROOT

pytestmark = [pytest.mark.django_db(transaction=True)]

OUTPUT = ROOT / "test-results" / "test_fleet_panel_browser"

def test_pause_and_resume_a_queue_in_the_browser(live_server, browser_page, redis_conn, settings):
    settings.PI_FLEET_PANEL_REFRESH_SECONDS = 1
    User.objects.create_superuser("operator", password="a-long-test-password")
    registry.publish(redis_conn, registry.HostFacts(name="hostA", declared=True, version="0.1.0", image="img"),
                     registry.ProcessFacts(worker_name="w-hostA", pid=1, proc="x/y/1/1", started_at=time.time(),
                                           queues=("pi-jobs", "pi-jobs@hostA")))
    page = browser_page

    page.goto(f"{live_server.url}/admin/fleet/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "a-long-test-password")
    page.click("input[type=submit]")
    page.wait_for_selector("#fleet-state")
    assert page.text_content("#fleet-state").strip() == "RUNNING"

    # A queue's Pause asks first, with an optional note and auto-resume time.
    page.click('tr[data-queue="pi-jobs@hostA"] button.fleet-pause-open')
    assert page.is_visible("dialog#fleet-pause-all")
    assert page.text_content("#fleet-pause-title") == "Pause queue pi-jobs@hostA?"
    page.fill("#fleet-pause-note", "disk swap")
    page.check("dialog#fleet-pause-all input[name=confirm]")
    page.click("#fleet-pause-all-confirm")
    page.wait_for_selector("ul.messagelist")
    assert page.text_content("#fleet-state").strip() == "PART PAUSED"
    assert pauses.read_flags(redis_conn)["pi-jobs@hostA"].note == "disk swap"
    assert pauses.read_flags(redis_conn)["pi-jobs@hostA"].by == "operator"
    assert page.text_content('tr[data-queue="pi-jobs@hostA"] .queue-state').strip() == "paused"
    assert "Paused 1 queue(s): pi-jobs@hostA" in page.text_content("ul.messagelist")
    OUTPUT.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(OUTPUT / "fleet-panel-part-paused.png"), full_page=True)

    page.click('tr[data-queue="pi-jobs@hostA"] button[type=submit]')
    page.wait_for_function("document.querySelector('#fleet-state').textContent.trim() === 'RUNNING'")
    assert pauses.read_flags(redis_conn) == {}

    # A change made elsewhere (another operator, the CLI) shows up without reloading the page.
    page.evaluate("window.__same_document = true")
    pauses.pause(redis_conn, ["pi-jobs"], by="cli:someone")
    page.wait_for_function("document.querySelector('#fleet-state').textContent.trim() === 'PART PAUSED'")
    assert page.evaluate("window.__same_document") is True

    # Pause all asks for a note and a confirmation first.
    page.click("#fleet-pause-all-open")
    page.fill("#fleet-pause-note", "browser test")
    page.check("dialog#fleet-pause-all input[name=confirm]")
    page.click("#fleet-pause-all-confirm")
    page.wait_for_function("document.querySelector('#fleet-state').textContent.trim() === 'PAUSED'")
    flags = pauses.read_flags(redis_conn)
    assert {flag.note for queue, flag in flags.items() if queue != "pi-jobs"} == {"browser test"}
    assert flags["pi-jobs"].by == "cli:someone"  # paused already: its pause is kept as it was
    page.screenshot(path=str(OUTPUT / "fleet-panel-paused.png"), full_page=True)
    assert Path(OUTPUT / "fleet-panel-part-paused.png").stat().st_size > 10_000
