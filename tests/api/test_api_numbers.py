"""Numbers read from a query or a path (a trigger id, a page size, an object's id) are ASCII digits within range:
anything else is a 400 for a filter and a 404 for an id, never a 500 (`int` and `str.isdigit` take superscripts and
other scripts' digits, and the database refuses what passes 64 bits). Property tests over every numeric filter and
id, as the receiver's headers have."""

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from apps.access import tokens
from apps.receiver.models import Trigger
from apps.worker.models import Outcome, Run

pytestmark = pytest.mark.django_db
set_hypothesis_home_dir(str(django_settings.VAR_DIR / "hypothesis"))  # not a .hypothesis/ folder in the checkout

MAX_ID = 2**63 - 1
DIGITS_OF_ANY_SCRIPT = "0123456789\u00b9\u00b2\u00b3\u2070\u0660\u0661\u06f4\u0967\U0001d7d7"  # all str.isdigit()
numberlike = (st.text(alphabet=DIGITS_OF_ANY_SCRIPT, min_size=1, max_size=45)
              | st.text(alphabet=DIGITS_OF_ANY_SCRIPT + " +-_.xe", min_size=1, max_size=24)
              | st.integers(-2**70, 2**70).map(str)
              | st.text(alphabet=st.characters(min_codepoint=32, exclude_categories=("Cs",)), max_size=20))
PROPERTY_SETTINGS = hypothesis_settings(
    max_examples=100, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# Each numeric filter: where it is, and the range its numbers may take.
FILTERS = [("/api/v1/runs", "trigger", 1, MAX_ID), ("/api/v1/runs", "page_size", 1, 200),
           ("/api/v1/deliveries", "page_size", 1, 200)]
ID_ROUTES = ["/api/v1/runs/{}", "/api/v1/limits/{}", "/api/v1/pause-windows/{}", "/api/v1/deliveries/{}",
             "/api/v1/triggers/{}"]


def in_range(text: str, low: int, high: int) -> bool:
    return text.isascii() and text.isdigit() and low <= int(text) <= high


@pytest.fixture
def headers(settings, redis_conn):
    settings.PI_API_RATE = "100000/min"
    root = User.objects.create_superuser("numbers", password="x")
    _, token = tokens.issue(root, name="numbers", scope="read")
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


@pytest.fixture
def a_run_of_a_trigger(db):
    trigger = Trigger.objects.create(position=0, on_type="label", label_any=["pi"], kind="github", flow="fix-bug")
    now = timezone.now()
    Run.objects.create(job_id="gh-numbers", kind="github", trigger=trigger, started_at=now, ended_at=now,
                       outcome=Outcome.COMPLETED)
    return trigger


@pytest.mark.parametrize("value", ["1" * 40, "\u00b2", "\u0663", "9223372036854775808", "-1", "+1", " 1", "1_0", "0"])
def test_the_trigger_filter_answers_400_on_anything_but_an_id(client, headers, value):
    answer = client.get("/api/v1/runs", {"trigger": value}, **headers)
    assert answer.status_code == 400 and answer.json()["error"] == "invalid" and "trigger" in answer.json()["fields"]


def test_the_trigger_filter_finds_the_triggers_runs(client, headers, a_run_of_a_trigger):
    answer = client.get("/api/v1/runs", {"trigger": str(a_run_of_a_trigger.pk)}, **headers)
    assert [run["job_id"] for run in answer.json()["results"]] == ["gh-numbers"]
    assert client.get("/api/v1/runs", {"trigger": str(MAX_ID)}, **headers).json()["results"] == []


@pytest.mark.parametrize("path, name, low, high", FILTERS, ids=[f"{path}?{name}" for path, name, _, _ in FILTERS])
@given(value=numberlike)
@hypothesis_settings(PROPERTY_SETTINGS)
def test_every_numeric_filter_takes_ascii_digits_in_range_and_nothing_else(client, headers, path, name, low, high,
                                                                           value):
    answer = client.get(path, {name: value}, **headers)
    if in_range(value, low, high):
        assert answer.status_code == 200, (value, answer.content)
    else:
        assert answer.status_code == 400 and name in answer.json()["fields"], (value, answer.status_code)


@pytest.mark.parametrize("route", ID_ROUTES)
@given(value=numberlike.filter(lambda text: "/" not in text and "?" not in text and "#" not in text))
@hypothesis_settings(PROPERTY_SETTINGS)
def test_an_id_that_is_no_id_is_not_found_never_a_server_error(client, headers, route, value):
    answer = client.get(route.format(value), **headers)
    assert answer.status_code == 404 and answer.json()["error"] == "not-found", (value, answer.status_code)


@pytest.mark.parametrize("route", ID_ROUTES)
def test_an_id_past_the_databases_range_is_not_found(client, headers, route):
    for value in ("1" * 40, "9223372036854775808", "\u00b2"):
        answer = client.get(route.format(value), **headers)
        assert answer.status_code == 404 and answer.json()["error"] == "not-found", (value, answer.content)
