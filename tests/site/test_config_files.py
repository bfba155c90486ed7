"""Importing and exporting the ancestor's scoped-limits.json and pause-windows JSON: round trips, and a bad
file changes nothing and says why."""

import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from apps.worker.models import PauseWindow, ScopedLimit

pytestmark = pytest.mark.django_db

LIMITS = {"version": 2, "limits": [
    {"scope": "acme/web", "day": 10, "concurrent": 2},
    {"scope": "github:acme/api", "week": 20},
    {"scope": "/srv/code/app", "month": 100},
]}
WINDOWS = {"windows": [
    {"scope": "*", "from": "22:00", "to": "06:00", "tz": "Europe/Amsterdam", "days": ["fri", "sat"]},
    {"scope": "github:acme/web", "from": "09:00", "to": "10:00", "tz": "UTC", "dateFrom": "2026-12-24",
     "dateTo": "2026-12-26"},
]}


def write(tmp_path, name, document):
    path = tmp_path / name
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return str(path)


def test_limits_round_trip(tmp_path, capsys):
    call_command("import_limits", write(tmp_path, "limits.json", LIMITS))
    assert "imported 3 scoped limits" in capsys.readouterr().out

    call_command("export_limits")
    exported = json.loads(capsys.readouterr().out)
    assert exported["version"] == 2  # a forge-qualified row needs version 2
    assert (sorted(exported["limits"], key=lambda row: row["scope"])
            == sorted(LIMITS["limits"], key=lambda row: row["scope"]))


def test_the_ancestors_dollar_rows_import_and_export_as_version_2(tmp_path, capsys, settings):
    from decimal import Decimal

    settings.PI_MAX_COST_USD = "1"  # a dollar window needs a per-run cap

    dollars = {"version": 2, "limits": [
        {"scope": "acme/web", "day": 10, "dayUsd": "2.50", "monthUsd": 40},
        {"scope": "github:acme/api", "weekUsd": "12.000001"},
    ]}
    call_command("import_limits", write(tmp_path, "limits.json", dollars))
    web = ScopedLimit.objects.get(scope="acme/web")
    assert (web.day, web.day_usd, web.week_usd, web.month_usd) == (10, Decimal("2.5"), None, Decimal("40"))

    call_command("export_limits")
    exported = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert exported == {"version": 2, "limits": [
        {"scope": "acme/web", "day": 10, "dayUsd": "2.5", "monthUsd": "40"},
        {"scope": "github:acme/api", "weekUsd": "12.000001"}]}


def test_an_ancestor_file_with_dollar_rows_and_no_per_run_cap_imports_with_a_warning(tmp_path, capsys, settings,
                                                                                    admin_client):
    """As the ancestor reads it: imported, said at the import, on the admin's limits page and by `doctor`; such a
    row's jobs are refused cost-cap-unset unless their trigger sets run.maxCostUsd (tests/worker/test_dollar_caps.py).
    By hand the admin still refuses to save one, saying why."""
    from apps.worker import doctor

    settings.PI_MAX_COST_USD = ""
    uncapped = {"version": 2, "limits": [{"scope": "acme/web", "dayUsd": "5"}, {"scope": "acme/api", "day": 3}]}
    call_command("import_limits", write(tmp_path, "limits.json", uncapped))
    said = capsys.readouterr()
    assert "imported 2 scoped limits" in said.out
    assert "1 scoped limit(s) with a dollar window and no per-run cap anywhere (acme/web)" in said.err
    assert "refused (cost-cap-unset) unless their trigger sets run.maxCostUsd" in said.err
    assert ScopedLimit.objects.get(scope="acme/web").day_usd == 5

    page = admin_client.get("/admin/worker/scopedlimit/").content.decode()
    assert "no per-run cap anywhere (acme/web)" in page
    assert [f.status for f in doctor.check_limits()] == [doctor.WARN]
    refused = admin_client.post("/admin/worker/scopedlimit/add/", {"scope": "acme/shop", "day_usd": "5"})
    assert refused.status_code == 200 and "a dollar window needs a per-run cap" in refused.content.decode()
    assert not ScopedLimit.objects.filter(scope="acme/shop").exists()

    settings.PI_MAX_COST_USD = "1"
    assert [f.status for f in doctor.check_limits()] == [doctor.OK]
    assert "no per-run cap anywhere" not in admin_client.get("/admin/worker/scopedlimit/").content.decode()


def test_windows_round_trip(tmp_path, capsys):
    call_command("import_pause_windows", write(tmp_path, "windows.json", WINDOWS))
    call_command("export_pause_windows")
    exported = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert sorted(exported["windows"], key=lambda w: w["scope"]) == sorted(WINDOWS["windows"], key=lambda w: w["scope"])


@pytest.mark.parametrize("document, message", [
    ("{not json", "not valid JSON"),
    ({"limits": []}, "`version` must be an integer"),
    ({"version": 4, "limits": []}, "newer pi-dispatch \\(version 4; this build understands 3\\)"),
    ({"version": 1, "limits": [{"scope": "acme/*", "day": 1}]}, "limit at index 0: scope: "),
    ({"version": 1, "limits": [{"scope": "a/b", "day": 1}, {"scope": "a/b", "week": 1}]}, "listed twice"),
    ({"version": 1, "limits": [{"scope": "a/b", "dayUsd": "1.5"}]},
     "unknown key 'dayUsd' \\(dollar windows need version 2"),
    ({"version": 2, "limits": [{"scope": "a/b", "weekUsd": "0"}]}, "limit at index 0: weekUsd must be more than 0"),
    ({"version": 2, "limits": [{"scope": "a/b", "monthUsd": "1.2345678"}]}, "monthUsd must be a plain number"),
    ({"version": 2, "limits": [{"scope": "a/b", "dayUsd": None}]}, "dayUsd must be a number of dollars"),
    ('{"version": 1, "version": 1, "limits": []}', "appears twice"),
])
def test_a_bad_limits_file_changes_nothing(tmp_path, document, message):
    ScopedLimit.objects.create(scope="keep/me", day=1)
    with pytest.raises(CommandError, match=message) as error:
        call_command("import_limits", write(tmp_path, "bad.json", document))
    assert "Nothing was changed" in str(error.value)
    assert list(ScopedLimit.objects.values_list("scope", flat=True)) == ["keep/me"]


@pytest.mark.parametrize("entry, message", [
    ({"scope": "*", "from": "9:00", "to": "10:00"}, "from must be HH:MM"),
    ({"scope": "*", "from": "09:00", "to": "09:00"}, "cannot last 24 hours"),
    ({"scope": "*", "from": "09:00", "to": "10:00", "tz": "Nowhere/Land"}, "IANA"),
    ({"scope": "*", "from": "09:00", "to": "10:00", "repeat": True}, "unknown key 'repeat'"),
])
def test_a_bad_windows_file_changes_nothing(tmp_path, entry, message):
    call_command("import_pause_windows", write(tmp_path, "ok.json", WINDOWS))
    with pytest.raises(CommandError, match=message):
        call_command("import_pause_windows", write(tmp_path, "bad.json", {"windows": [WINDOWS["windows"][0], entry]}))
    assert PauseWindow.objects.count() == 2
