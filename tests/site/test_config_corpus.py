"""The ancestor's projects.json and scoped-limits.json (versions 1, 2 and 3), every key of them: each file of
tests/payloads/config_files/ imports, exports, and imports again to the same rows; the export writes the lowest
version that holds its rows; and each refusal (a bad value, a key its version cannot hold, a feature not built
yet) changes nothing and names its key."""

import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.forms.models import model_to_dict

from apps.receiver.validation import key_problems
from apps.worker.models import Project, ScopedLimit

pytestmark = pytest.mark.django_db

CORPUS = Path(__file__).resolve().parents[1] / "payloads" / "config_files"
LIMIT_FILES = sorted(CORPUS.glob("scoped-limits-*.json"))


@pytest.fixture(autouse=True)
def per_run_cap(settings):
    """The corpus files hold dollar windows, which a deployment takes only with a per-run cap."""
    settings.PI_MAX_COST_USD = "5"


def rows(model) -> list[dict]:
    return [{k: v for k, v in model_to_dict(row).items() if k != "id"} for row in model.objects.order_by("pk")]


def exported(command: str, capsys) -> dict:
    capsys.readouterr()
    call_command(command)
    return json.loads(capsys.readouterr().out)


def reimport(command: str, document: dict, tmp_path) -> None:
    path = tmp_path / f"{command}.json"
    path.write_text(json.dumps(document))
    call_command(command, str(path))


def test_the_corpus_has_every_key_of_both_files():
    limit_keys = {key for path in LIMIT_FILES for row in json.loads(path.read_text())["limits"] for key in row}
    assert limit_keys == {"scope", "day", "week", "month", "concurrent", "dayUsd", "weekUsd", "monthUsd", "memory",
                          "cpus", "hostShare", "minJobs"}
    assert {json.loads(path.read_text())["version"] for path in LIMIT_FILES} == {1, 2, 3}
    projects = json.loads((CORPUS / "projects.json").read_text())["projects"]
    assert {key for entry in projects for key in entry} == {"id", "name", "members"}


def test_projects_import_export_and_import_again_to_the_same_rows(tmp_path, capsys):
    call_command("import_projects", str(CORPUS / "projects.json"))
    first = rows(Project)
    assert [(row["slug"], row["name"], row["members"]) for row in first] == [
        ("storefront", "Storefront", ["github:acme/web", "gitlab:acme/shop/api", "/srv/code/storefront"]),
        ("ops-2", "", ["forgejo:infra/deploy", "azure:platform/tools"])]
    document = exported("export_projects", capsys)
    assert document["version"] == 1
    reimport("import_projects", document, tmp_path)
    assert sorted(rows(Project), key=lambda row: row["slug"]) == sorted(first, key=lambda row: row["slug"])


@pytest.mark.parametrize("path", LIMIT_FILES, ids=lambda path: path.stem)
def test_each_limits_file_imports_exports_and_imports_again_to_the_same_rows(path, tmp_path, capsys):
    call_command("import_projects", str(CORPUS / "projects.json"))
    call_command("import_limits", str(path))
    first = sorted(rows(ScopedLimit), key=lambda row: row["scope"])
    assert len(first) == len(json.loads(path.read_text())["limits"])

    document = exported("export_limits", capsys)
    # The lowest version that holds the rows: each corpus file uses its version's features.
    assert document["version"] == json.loads(path.read_text())["version"]
    reimport("import_limits", document, tmp_path)
    assert sorted(rows(ScopedLimit), key=lambda row: row["scope"]) == first


def test_version_3_sizes_are_read_as_the_ancestor_writes_them(capsys):
    call_command("import_projects", str(CORPUS / "projects.json"))
    call_command("import_limits", str(CORPUS / "scoped-limits-v3.json"))
    storefront = ScopedLimit.objects.get(scope="project:storefront")
    assert ((storefront.memory, str(storefront.cpus), storefront.host_share, storefront.min_jobs)
            == ("1g", "1.50", 60, 2))
    document = exported("export_limits", capsys)
    row = next(row for row in document["limits"] if row["scope"] == "project:storefront")
    assert (row["memory"], row["cpus"]) == ("1g", 1.5)


def test_the_export_drops_back_to_version_1_when_the_last_newer_feature_goes(capsys, tmp_path):
    call_command("import_projects", str(CORPUS / "projects.json"))
    call_command("import_limits", str(CORPUS / "scoped-limits-v3.json"))
    ScopedLimit.objects.exclude(scope="acme/web").delete()
    assert exported("export_limits", capsys) == {"version": 1, "limits": [{"scope": "acme/web", "day": 10}]}


LIMIT_REFUSALS = [
    # (file, the key the message names, more of the message)
    ({"version": 1, "limits": [{"scope": "github:acme/web", "day": 1}]}, "github:acme/web", "needs version 2"),
    ({"version": 1, "limits": [{"scope": "a/b", "weekUsd": "1"}]}, "weekUsd", "need version 2"),
    ({"version": 2, "limits": [{"scope": "project:storefront", "memory": "1g"}]}, "memory", "need version 3"),
    ({"version": 2, "limits": [{"scope": "project:storefront", "minJobs": 1}]}, "minJobs", "need version 3"),
    ({"version": 2, "limits": [{"scope": "project:nowhere", "day": 1}]}, "scope", "no project 'nowhere'"),
    ({"version": 2, "limits": [{"scope": "Model:anthropic/x", "dayUsd": "1"}]}, "scope", "spell the prefix exactly"),
    ({"version": 2, "limits": [{"scope": "models:anthropic/x", "dayUsd": "1"}]}, "scope", "spell the prefix exactly"),
    ({"version": 2, "limits": [{"scope": "model:anthropic", "dayUsd": "1"}]}, "scope", "model:<provider>/<model>"),
    ({"version": 2, "limits": [{"scope": "model:anthropic/x", "day": 3}]}, "day", "dollar windows only"),
    ({"version": 2, "limits": [{"scope": "model:a/x", "dayUsd": "1"}, {"scope": "model:A/X", "dayUsd": "2"}]},
     "model:a/x", "listed twice"),
    ({"version": 3, "limits": [{"scope": "acme/web", "memory": "2g"}]}, "memory", "project:<id> rows only"),
    ({"version": 3, "limits": [{"scope": "project:storefront", "memory": "256m"}]}, "memory", "512m to 1024g"),
    ({"version": 3, "limits": [{"scope": "project:storefront", "memory": "2t"}]}, "memory", "m or g"),
    ({"version": 3, "limits": [{"scope": "project:storefront", "cpus": 0.1}]}, "cpus", "at least 0.25"),
    ({"version": 3, "limits": [{"scope": "project:storefront", "cpus": 0.125}]}, "cpus", "at most 2 decimals"),
    ({"version": 3, "limits": [{"scope": "project:storefront", "hostShare": 101}]}, "host_share", "1 and 100"),
    ({"version": 3, "limits": [{"scope": "project:storefront", "minJobs": 1}]}, "min_jobs", "needs a size"),
    ({"version": 3, "limits": [{"scope": "project:storefront", "minJobs": 3, "concurrent": 2, "cpus": 1}]},
     "min_jobs", "at most concurrent"),
    ({"version": 3, "limits": [{"scope": "project:storefront", "day": 1, "weight": 2}]}, "weight", "unknown key"),
    ({"version": 3, "envelope": {"totalUsd": "100"}, "limits": []}, "envelope", "not built yet"),
    ({"version": 4, "limits": []}, "version 4", "newer pi-dispatch"),
]


@pytest.mark.parametrize("document, key, message", LIMIT_REFUSALS, ids=lambda value: str(value)[:40])
def test_a_refused_limits_file_names_its_key_and_changes_nothing(document, key, message, tmp_path):
    call_command("import_projects", str(CORPUS / "projects.json"))
    call_command("import_limits", str(CORPUS / "scoped-limits-v1.json"))
    before = rows(ScopedLimit)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    with pytest.raises(CommandError) as refused:
        call_command("import_limits", str(path))
    assert key in str(refused.value) and message in str(refused.value)
    assert "Nothing was changed" in str(refused.value)
    assert rows(ScopedLimit) == before


PROJECT_REFUSALS = [
    ({"version": 1, "projects": [{"id": "Shop", "members": ["github:a/b"]}]}, "slug", "lowercase"),
    ({"version": 1, "projects": [{"id": "x" * 33, "members": ["github:a/b"]}]}, "slug", "1-32"),
    ({"version": 1, "projects": [{"id": "shop", "members": ["acme/web"]}]}, "members", "name the forge"),
    ({"version": 1, "projects": [{"id": "shop", "members": ["srv/code"]}]}, "members", "name the forge"),
    ({"version": 1, "projects": [{"id": "shop", "members": []}]}, "members", "at least one member"),
    ({"version": 1, "projects": [{"id": "shop", "members": ["github:a/b", "github:a/b"]}]}, "members", "twice"),
    ({"version": 1, "projects": [{"id": "a", "members": ["/srv/x"]}, {"id": "b", "members": ["/srv/x/"]}]},
     "/srv/x", "already a member of project 'a'"),
    ({"version": 1, "projects": [{"id": "a", "members": ["/srv/x"]}, {"id": "a", "members": ["/srv/y"]}]},
     "'a'", "listed twice"),
    ({"version": 1, "projects": [{"id": "a", "members": ["/srv/x"], "owner": "me"}]}, "owner", "unknown key"),
    ({"version": 1, "projects": [{"id": "a", "members": ["/srv/x"], "portfolio": True}]}, "portfolio",
     "not built yet"),
    ({"version": 1, "envelope": {"totalUsd": "100"}, "projects": []}, "envelope", "not built yet"),
    ({"version": 2, "projects": []}, "version 2", "newer pi-dispatch"),
    # The limits name project:storefront: dropping it would leave a cap that applies to nothing.
    ({"version": 1, "projects": [{"id": "ops-2", "members": ["/srv/ops"]}]}, "project:storefront", "drops"),
]


@pytest.mark.parametrize("document, key, message", PROJECT_REFUSALS, ids=lambda value: str(value)[:40])
def test_a_refused_projects_file_names_its_key_and_changes_nothing(document, key, message, tmp_path):
    call_command("import_projects", str(CORPUS / "projects.json"))
    call_command("import_limits", str(CORPUS / "scoped-limits-v2.json"))
    before = rows(Project)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    with pytest.raises(CommandError) as refused:
        call_command("import_projects", str(path))
    assert key in str(refused.value) and message in str(refused.value)
    assert rows(Project) == before


def test_an_envelope_file_is_refused_by_name(tmp_path):
    path = tmp_path / "envelope.json"
    path.write_text(json.dumps({"version": 1, "window": "month", "totalUsd": "500", "floorsUsd": {"storefront": "50"}}))
    with pytest.raises(CommandError, match="the envelope \\(allocation of a dollar total across projects\\) is not "
                                           "built yet. Nothing was changed"):
        call_command("import_envelope", str(path))


def test_a_portfolio_trigger_is_refused_by_name():
    problems, dropped = key_problems({"kind": "local", "flow": "plan", "portfolio": True}, "run")
    assert [(problem.path, problem.message) for problem in problems] == [(
        "run.portfolio", "run.portfolio: portfolio jobs (a run that plans the envelope's allocation across projects) "
                         "are not built yet; remove it.")]
    assert dropped == []
