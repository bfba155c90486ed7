"""Tokens today read the same on the admin index, the fleet panel and the cost page: one counter (the gateway's
day counter, apps/worker/spend.py) in one format (`12,345`), and a `doctor --live` probe is not in it."""

import re

import pytest
from django.utils import timezone

from apps.worker.gates import budget
from tests.cost_support import make_run

pytestmark = [pytest.mark.django_db(transaction=True)]


def shown_tokens(admin_client) -> dict[str, str]:
    index = admin_client.get("/admin/").content.decode()
    panel = admin_client.get("/admin/fleet/fleetpanel/").content.decode()
    costs = admin_client.get("/admin/insight/spend/?window=7d").content.decode()
    budget_row = costs.split('id="budget-tokens-day"')[1].split("</tr>")[0]
    return {
        "index": re.search(r'id="strip-tokens-today">([\d,]+) tokens', index).group(1),
        "panel": re.search(r'id="tokens-today"><td>tokens today</td><td>([^<]*)<', panel).group(1),
        "cost page budget": re.search(r'<td class="num">([^<]*)</td>', budget_row).group(1),
        "cost page tile": re.search(r'id="kpi-tokens".*?class="kpi-value">([^<]*)<', costs, re.S).group(1).strip(),
    }


def test_the_three_pages_say_the_same_tokens_today(admin_client, redis_conn, settings):
    settings.PI_DAILY_TOKEN_CAP = 1_000_000
    make_run("gh-today", 0, cost="0.40", tokens=12_345)
    budget.record_tokens(redis_conn, 12_345, timezone.now())  # what the run's gateway counted

    assert set(shown_tokens(admin_client).values()) == {"12,345"}, shown_tokens(admin_client)
    index = admin_client.get("/admin/").content.decode()
    assert "12,345 tokens of 1,000,000" in index
