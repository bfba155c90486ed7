"""The cost page in a real browser (Playwright driving Debian's Chromium against `live_server`), on two data sets:
a quiet week and a busy month with estimated days. The drawing follows the data (columns, estimated columns,
tiles), the window links work, a breakdown link opens its runs, and both screenshots are kept under
test-results/ and compared."""

import hashlib
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from apps.insight import costs
from apps.worker.models import Run
from tests.conftest import ROOT
from tests.cost_support import make_run

pytestmark = [pytest.mark.django_db(transaction=True)]

OUTPUT = ROOT / "test-results" / "test_cost_page_browser"


def quiet_week():
    make_run("gh-q1", 0, cost="0.40", tokens=4_000)
    make_run("gh-q2", 2, cost="0.60", tokens=6_000, host="hostB")


def busy_month():
    for index in range(60):
        days_ago = index % 20
        make_run(f"gh-b{index}", days_ago, cost=f"{1 + index % 7}.25", tokens=20_000 + index,
                 metered=days_ago not in (4, 11), flow=("fix-bug", "review", "triage")[index % 3],
                 host=f"host{index % 10}", outcome="failed" if index % 9 == 0 else "completed")


def look(page, live_server, name: str) -> dict:
    page.goto(f"{live_server.url}/admin/insight/spend/?window=30d")
    page.wait_for_selector("#cost-daily")
    OUTPUT.mkdir(parents=True, exist_ok=True)
    shot = OUTPUT / f"cost-page-{name}.png"
    page.screenshot(path=str(shot), full_page=True)
    box = page.locator("#cost-daily").bounding_box()
    return {
        "shot": shot,
        "columns": page.locator("#cost-daily rect.day-col[data-day]").count(),
        "spent_columns": page.locator("#cost-daily rect.day-col[data-day]:not(.quiet)").count(),
        "estimated_columns": page.locator("#cost-daily rect.day-col.estimated[data-day]").count(),
        "spend": page.text_content("#kpi-spend .kpi-value").strip(),
        "runs": page.text_content("#kpi-runs .kpi-value").strip(),
        "chart_width": box["width"],
        "host_rows": page.locator("#by-host tbody tr").count(),
    }


def log_in(page, live_server):
    User.objects.create_superuser("operator", password="a-long-test-password")
    page.goto(f"{live_server.url}/admin/insight/spend/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "a-long-test-password")
    page.click("input[type=submit]")
    page.wait_for_selector("#cost-page")


def test_the_cost_page_draws_what_the_data_says(live_server, browser_page):  # noqa: F811
    page = browser_page
    log_in(page, live_server)

    quiet_week()
    quiet = look(page, live_server, "quiet-week")
    Run.objects.all().delete()
    busy_month()
    busy = look(page, live_server, "busy-month")

    assert quiet["columns"] == busy["columns"] == 30  # one per UTC day of the window, quiet days as ticks
    assert (quiet["spent_columns"], busy["spent_columns"]) == (2, 20)
    assert (quiet["estimated_columns"], busy["estimated_columns"]) == (0, 2)
    assert quiet["spend"] == "$1.00" and quiet["runs"] == "2"
    busy_total = sum(1 + index % 7 + 0.25 for index in range(60))
    assert busy["spend"] == f"~${busy_total:,.2f} est." and busy["runs"] == "60"
    assert busy["host_rows"] == 9 and page.text_content("#by-host tr.more").strip().startswith("+2 more")
    assert quiet["chart_width"] > 600  # the drawing fills the page, it is not a thumbnail
    for look_ in (quiet, busy):
        assert look_["shot"].stat().st_size > 20_000
    assert busy["shot"].stat().st_size > quiet["shot"].stat().st_size  # more drawn, more bytes
    digest = lambda path: hashlib.sha256(Path(path).read_bytes()).hexdigest()  # noqa: E731
    assert digest(quiet["shot"]) != digest(busy["shot"])

    # The window links redraw it, and a breakdown row opens its runs in the run list.
    page.click('a[data-window="7d"]')
    page.wait_for_selector('#cost-page[data-window="7d"]')
    assert page.locator("#cost-daily rect.day-col[data-day]").count() == 7
    page.screenshot(path=str(OUTPUT / "cost-page-busy-7d.png"), full_page=True)
    top_flow = costs.summary("7d").breakdowns[0].rows[0]
    page.click("#by-flow tbody tr:first-child a")
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == top_flow.runs > 0
