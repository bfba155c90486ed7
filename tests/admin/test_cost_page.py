"""The cost page (admin:insight_spend_changelist): who may see it, the window and its tiles, the daily columns with
estimated days drawn as such, breakdowns that link to exactly their runs in the run list, the budget in force
with its state words (dollar windows once the dollar caps exist), and a fixed number of queries whatever the
history's length."""

import re
from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from apps.insight import costs
from apps.worker.gates import budget
from apps.worker.gates.runtime_settings import current
from tests.cost_support import make_run

pytestmark = [pytest.mark.django_db(transaction=True)]

PAGE = "/admin/insight/spend/"


def tile(page: str, name: str) -> str:
    block = page.split(f'id="kpi-{name}"')[1]
    return re.search(r'class="kpi-value">([^<]*)<', block).group(1).strip()


def known_history():
    """Seven runs: five inside the last 7 days, one 20 days back; one an estimate, one refused before spend."""
    make_run("gh-a1", 0, cost="1.50", tokens=10_000, host="hostA")
    make_run("gh-a2", 1, cost="1.50", tokens=10_000, host="hostA", flow="review")
    make_run("gh-a3", 2, cost="1.50", tokens=10_000, host="hostB", model="gpt-5")
    make_run("gh-a4", 3, cost="0.25", tokens=2_000, metered=False, outcome="failed", reason="runner-infra",
             host="hostB", scope="/srv/checkout", kind="local", target="/srv/checkout")
    make_run("gh-a5", 3, outcome="policy", reason="over-budget", host="", budget_reserved=True)
    make_run("gh-old", 20, cost="2.00", tokens=5_000, host="hostC")


def test_only_who_may_read_runs_sees_it(client):
    assert client.get(PAGE)["Location"].startswith("/admin/login/")
    staff = User.objects.create_user("viewer", password="pw", is_staff=True)
    client.force_login(staff)
    assert client.get(PAGE).status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_run", content_type__app_label="worker"))
    assert client.get(PAGE).status_code == 200
    assert reverse("admin:insight_spend_changelist") == PAGE


def test_the_fleet_panel_links_to_it_for_who_may_see_it(admin_client, client):
    assert f'href="{PAGE}"' in admin_client.get("/admin/fleet/fleetpanel/").content.decode()
    fleet_only = User.objects.create_user("fleet-viewer", password="pw", is_staff=True)
    fleet_only.user_permissions.add(Permission.objects.get(codename="view_fleet"))
    client.force_login(fleet_only)
    panel = client.get("/admin/fleet/fleetpanel/")
    assert panel.status_code == 200 and f'href="{PAGE}"' not in panel.content.decode()


def test_tiles_follow_the_window(admin_client):
    known_history()

    week = admin_client.get(PAGE + "?window=7d").content.decode()
    # 1.50 * 3 metered + 0.25 estimated; the refused run counts as a run at an exact $0.
    assert tile(week, "spend") == "~$4.75 est." and "1 run estimated" in week
    assert tile(week, "runs") == "5"
    assert tile(week, "completed") == "60.0%" and "3 of 5" in week
    assert tile(week, "tokens") == "32,000"
    assert tile(week, "per-completed") == "~$1.58 est."  # 4.75 / 3: what the failures cost is included
    assert 'id="cost-window">7 days: ' in week and " UTC to " in week and "(7 UTC days)" in week

    month = admin_client.get(PAGE + "?window=30d").content.decode()
    assert tile(month, "spend") == "~$6.75 est." and tile(month, "runs") == "6"
    assert tile(month, "per-completed") == "~$1.69 est." and tile(month, "tokens") == "37,000"

    today = timezone.now().astimezone(UTC)
    mtd = admin_client.get(PAGE + "?window=mtd").content.decode()
    assert f"({today.day} UTC day" in mtd
    assert int(tile(mtd, "runs")) == sum(1 for days_ago in (0, 1, 2, 3, 3, 20) if days_ago < today.day)

    assert 'class="current" aria-current="page">30 days' in admin_client.get(PAGE + "?window=bogus").content.decode()


def test_all_metered_spend_has_no_marker(admin_client):
    make_run("gh-m1", 0, cost="0.0252", tokens=7440)
    page = admin_client.get(PAGE).content.decode()
    assert tile(page, "spend") == "$0.0252" and "all metered" in page
    assert tile(page, "per-completed") == "$0.0252"


def test_daily_columns_mark_the_estimated_days_and_draw_the_running_total(admin_client):
    known_history()

    page = admin_client.get(PAGE + "?window=7d").content.decode()
    svg = page.split('<svg xmlns="http://www.w3.org/2000/svg" id="cost-daily"')[1].split("</svg>")[0]
    assert 'data-days="7"' in svg and 'data-estimated-days="1"' in svg
    columns = re.findall(r'<rect class="day-col( [a-z]+)?"[^>]*data-day="([0-9-]+)" data-spend="([0-9.]+)"', svg)
    assert len(columns) == 7
    by_day = {day: (kind.strip(), float(spend)) for kind, day, spend in columns}
    three_back = costs.window("7d").days[-4].isoformat()
    assert by_day[three_back] == ("estimated", 0.25)
    assert sorted(kind for kind, _ in by_day.values()) == ["", "", "", "estimated", "quiet", "quiet", "quiet"]
    assert '<polyline class="cumulative" ' in svg and '<polyline class="cumulative estimated" ' in svg
    assert "0.25" in svg and "1 estimated" in svg  # the estimated day's tooltip says so


def changelist_count(client, url: str) -> int:
    response = client.get(url)
    assert response.status_code == 200 and "e=1" not in response.get("Location", ""), url
    return response.context["cl"].result_count


def test_every_breakdown_row_links_to_exactly_its_runs(admin_client, label_trigger):
    known_history()
    make_run("gh-t1", 2, cost="0.30", tokens=300, trigger=label_trigger, trigger_type="label")
    make_run("gh-b1", 1, cost="0.10", tokens=100, flow="", command="summarise", trigger_type="manual", host="hostB")
    summary = costs.summary("7d")

    names = [b.name for b in summary.breakdowns]
    assert names == ["flow", "trigger", "model", "repository / folder", "project", "host", "outcome"]
    checked = 0
    for breakdown in summary.breakdowns:
        assert breakdown.rows, breakdown.name
        for row in breakdown.rows:
            assert changelist_count(admin_client, row.link) == row.runs, (breakdown.name, row.label)
            checked += 1
    assert checked >= 15
    by = {b.name: {row.label: row for row in b.rows} for b in summary.breakdowns}
    assert by["host"]["hostB"].runs == 3 and by["host"]["(no host)"].runs == 1
    assert by["trigger"][str(label_trigger)].runs == 1 and by["trigger"]["(no trigger)"].runs == 5
    assert "hostC" not in by["host"]  # outside the window, and so outside its link's date range
    assert by["model"]["anthropic/gpt-5"].runs == 1 and by["model"]["anthropic/claude-sonnet-4-5"].runs == 5
    assert set(by["outcome"]) == {"completed", "failed", "policy"}
    assert by["flow"]["/summarise"].runs == 1 and by["trigger"]["(manual)"].runs == 1

    page = admin_client.get(PAGE + "?window=7d").content.decode()
    assert page.count('href="/admin/worker/run/?started_at__gte=') >= checked


def test_spend_is_broken_down_by_the_project_each_run_recorded(admin_client):
    make_run("gh-p1", 0, cost="1.25", tokens=100, project="storefront")
    make_run("gh-p2", 1, cost="0.75", tokens=100, project="storefront", scope="gitlab:acme/shop")
    make_run("gh-p3", 1, cost="2.25", tokens=100, project="ops")
    make_run("gh-p4", 2, cost="0.10", tokens=100)
    make_run("gh-p5", 10, cost="9.00", tokens=100, project="ops")  # outside the 7 days

    page = admin_client.get(PAGE + "?window=7d").content.decode()
    projects = page.split('id="by-project"')[1].split("</table>")[0]
    rows = re.findall(r'<a href="([^"]+)">([^<]+)</a>.*?</tr>', projects, re.S)
    assert [label for _, label in rows] == ["ops", "storefront", "(no project)"]  # the dearest first
    assert "$2.25" in projects and "$0.10" in projects and "$9.00" not in projects
    storefront = projects.split(">storefront</a>")[1].split("</tr>")[0]
    assert "$2.00" in storefront and ">2<" in storefront  # 1.25 + 0.75, two runs on two forges
    for link, label in rows:
        assert changelist_count(admin_client, link.replace("&amp;", "&")) == \
            {"ops": 1, "storefront": 2, "(no project)": 1}[label]


def test_a_breakdown_shows_the_top_eight_then_how_many_more(admin_client):
    for index in range(11):
        make_run(f"gh-h{index}", 0, cost=f"{index + 1}.00", tokens=100, host=f"host{index:02d}")

    page = admin_client.get(PAGE).content.decode()
    hosts = page.split('id="by-host"')[1].split("</table>")[0]
    assert "host10" in hosts and "host03" in hosts and "host02" not in hosts  # the dearest first
    assert "+3 more" in hosts and "$6.00" in hosts  # 1 + 2 + 3 dollars of the three left out


def test_the_budget_in_force_with_its_state_words(admin_client, redis_conn, settings):
    settings.PI_DAILY_CAP, settings.PI_WEEKLY_CAP, settings.PI_SOFT_HOLD_PCT = 4, None, 50
    settings.PI_DAILY_TOKEN_CAP = 1000
    now = timezone.now()
    for _ in range(2):
        budget.reserve(redis_conn, None, current(), now)
    budget.record_tokens(redis_conn, 1500, now)

    page = admin_client.get(PAGE).content.decode()

    def row(ledger, window):
        return re.sub(r"\s+", " ", page.split(f'id="budget-{ledger}-{window}"')[1].split("</tr>")[0])

    assert '<td class="num">2</td>' in row("jobs", "day") and '<td class="num">4</td>' in row("jobs", "day")
    assert '<span class="state soft-hold">soft hold</span>' in row("jobs", "day")  # the next start would wait
    assert "no cap" in row("jobs", "week") and ">off<" in row("jobs", "week")
    assert '<td class="num">1,500</td>' in row("tokens", "day") and ">over<" in row("tokens", "day")

    for _ in range(2):  # held, and refused: a refused reservation still counts against the cap
        with pytest.raises(budget.CapRefusal):
            budget.reserve(redis_conn, None, current(), now)
    page = admin_client.get(PAGE).content.decode()
    assert re.search(r"<td class=\"num\">4</td> ?<td class=\"num\">—</td> ?<td class=\"num\">4</td>",
                     row("jobs", "day"))
    assert '<span class="state over">over</span>' in row("jobs", "day")


def test_each_scoped_limit_shows_its_windows(admin_client, redis_conn, settings):
    from apps.worker.models import ScopedLimit

    settings.PI_DAILY_CAP = 100
    limit = ScopedLimit.objects.create(scope="acme/web", day=2, month=40)
    ScopedLimit.objects.create(scope="acme/quiet", concurrent=1)  # no count cap: no window to show
    for _ in range(2):
        budget.reserve(redis_conn, limit, current(), timezone.now())

    page = admin_client.get(PAGE).content.decode()

    day = re.sub(r"\s+", " ", page.split('id="budget-jobs-acmeweb-day"')[1].split("</tr>")[0])
    assert '<td class="num">2</td>' in day and ">over<" in day  # the next job of acme/web is refused scope-cap
    month = re.sub(r"\s+", " ", page.split('id="budget-jobs-acmeweb-month"')[1].split("</tr>")[0])
    assert '<td class="num">40</td>' in month and ">ok<" in month
    assert 'data-scope="acme/quiet"' not in page


def test_the_dollar_windows_show_what_settled_runs_used_and_running_jobs_hold(admin_client, redis_conn, settings):
    from decimal import Decimal

    from apps.worker.gates import runtime_settings
    from tests.jobspecs import forge_spec

    settings.PI_MAX_COST_USD, settings.PI_DAILY_COST_USD, settings.PI_MONTHLY_COST_USD = "2", "5", "10"
    runtime, now = runtime_settings.current(), timezone.now()
    settled = budget.reserve_dollars(redis_conn, forge_spec("gh-cost-settled"), None, runtime, now)
    budget.settle_dollars(redis_conn, settled, ran=True, cost=Decimal("1.25"))
    budget.reserve_dollars(redis_conn, forge_spec("gh-cost-running"), None, runtime, now)  # $2 held

    page = re.sub(r"\s+", " ", admin_client.get(PAGE).content.decode())

    day = page.split('id="budget-dollars-day"')[1].split("</tr>")[0]
    assert "$1.25" in day and "$2.00" in day and "$5.00" in day and "65%" in day and ">ok<" in day
    month = page.split('id="budget-dollars-month"')[1].split("</tr>")[0]
    assert "$10.00" in month and "32%" in month and ">ok<" in month  # $3.25 of $10
    with pytest.raises(budget.DollarRefusal):  # $5.25 would pass the day's $5: refused, nothing held
        budget.reserve_dollars(redis_conn, forge_spec("gh-cost-third"), None, runtime, now)
    again = re.sub(r"\s+", " ", admin_client.get(PAGE).content.decode())
    assert again.split('id="budget-dollars-day"')[1].split("</tr>")[0] == day


def test_the_page_costs_the_same_queries_for_a_long_history(admin_client, redis_conn):
    make_run("gh-q0", 0, cost="1", tokens=10)
    admin_client.get(PAGE)
    redis_conn.flushdb()
    with CaptureQueriesContext(connection) as few:
        admin_client.get(PAGE)
    for index in range(60):
        make_run(f"gh-q{index + 1}", index % 30, cost="1", tokens=10, host=f"h{index % 12}", flow=f"f{index % 9}")
    redis_conn.flushdb()
    with CaptureQueriesContext(connection) as many:
        admin_client.get(PAGE)
    assert len(many) == len(few)
    with CaptureQueriesContext(connection) as kept:
        admin_client.get(PAGE)
    assert len(kept) < len(many)  # the closed days' partials were kept: only yesterday and today are read


def test_a_run_recorded_late_for_a_closed_day_shows_at_once(admin_client, redis_conn):
    make_run("gh-c1", 5, cost="1.00", tokens=10)
    assert tile(admin_client.get(PAGE).content.decode(), "spend") == "$1.00"
    assert redis_conn.exists(costs.partial_key(costs.window("30d").days[-6]))  # kept

    make_run("gh-c2", 5, cost="2.00", tokens=10)  # a lost worker's run, settled days later
    assert tile(admin_client.get(PAGE).content.decode(), "spend") == "$3.00"
    from apps.worker.models import Run

    Run.objects.filter(job_id="gh-c1").delete()
    assert tile(admin_client.get(PAGE).content.decode(), "spend") == "$2.00"


def test_a_record_written_while_a_partial_is_computed_does_not_leave_it_stale(admin_client, monkeypatch):
    make_run("gh-r1", 5, cost="1.00", tokens=10)
    real = costs._partials

    def slow_partials(start, end, kind="page"):
        computed = real(start, end, kind)
        if start < costs._midnight(costs.window("30d").days[-2]):  # the closed days, read before this record
            make_run("gh-r2", 5, cost="2.00", tokens=10)
        return computed

    monkeypatch.setattr(costs, "_partials", slow_partials)
    assert tile(admin_client.get(PAGE).content.decode(), "spend") == "$1.00"  # computed before gh-r2 existed
    monkeypatch.setattr(costs, "_partials", real)
    assert tile(admin_client.get(PAGE).content.decode(), "spend") == "$3.00"


def test_without_redis_the_page_reads_every_day_from_the_database(admin_client, settings):
    make_run("gh-n1", 5, cost="1.00", tokens=10)
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    page = admin_client.get(PAGE).content.decode()
    assert tile(page, "spend") == "$1.00" and "the budget counters could not be read" in page


def test_dollars_read_like_dollars():
    from apps.insight.format import count, dollars, share

    assert dollars(0) == "$0.00" and dollars("0.025200") == "$0.0252" and dollars("1234.5") == "$1,234.50"
    assert dollars("4.125", estimated=True) == "~$4.13 est." and dollars(None) == "—"
    assert count(1234567) == "1,234,567" and share(0.6) == "60.0%" and share(None) == "—"
    assert costs.window("7d", datetime(2026, 12, 1, 15, 0, tzinfo=UTC)).start == datetime(2026, 11, 25, tzinfo=UTC)
    assert costs.window("mtd", datetime(2026, 12, 1, 15, 0, tzinfo=UTC)).days == [datetime(2026, 12, 1).date()]
