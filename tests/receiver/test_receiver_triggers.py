"""The trigger language: one validation for the admin form and the importer, errors that name the field and
the rule, near-misses refused, and `import_triggers` / `export_triggers` round-tripping the ancestor's file."""

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from apps.receiver import triggerfile
from apps.receiver.models import Trigger
from apps.receiver.validation import entry_problems
from tests.receiver_support import PAYLOADS

pytestmark = pytest.mark.django_db

ANCESTOR = PAYLOADS / "triggers" / "ancestor.json"


def problems(on, run):
    found, _ = entry_problems({"on": on, "run": run})
    return [(problem.path, problem.message) for problem in found]


def assert_refused(on, run, path, fragment):
    found = problems(on, run)
    assert any(p == path and fragment in message for p, message in found), found


LABEL = {"type": "label", "any": ["pi"]}
GITHUB = {"kind": "github", "flow": "fix-bug"}


def test_the_ancestors_whole_language_is_valid():
    parsed = triggerfile.parse(ANCESTOR.read_text())
    assert len(parsed.entries) == 15 and parsed.warnings == []


@pytest.mark.parametrize("on, run, path, fragment", [
    ({"type": "disarmed"}, GITHUB, "on.type", "on.type must be one of"),
    (LABEL, {"kind": "bitbucket", "flow": "x"}, "run.kind", "run.kind must be one of"),
    ({"type": "cron", "id": "n", "pattern": "0 3 * * *"}, {**GITHUB, "folder": "/x", "task": "t"}, "run.kind",
     'must be "local"'),
    (LABEL, {"kind": "local", "flow": "x"}, "run.kind", "fired by a forge"),
    ({"type": "label", "none": ["wontfix"]}, GITHUB, "on.any", "at least one positive selector"),
    ({"type": "label", "any": "pi"}, GITHUB, "on.any", "must be a list"),
    ({"type": "label", "any": ["pi", "pi"]}, GITHUB, "on.any", "twice"),
    (LABEL, {"kind": "github"}, "run.flow", "exactly one of run.flow"),
    (LABEL, {"kind": "github", "flow": "a", "command": "b"}, "run.flow", "exactly one of run.flow"),
    (LABEL, {"kind": "github", "flow": "Fix Bug"}, "run.flow", "lowercase letters"),
    (LABEL, {"kind": "github", "command": "/retro"}, "run.command", "leading '/'"),
    ({"type": "comment"}, GITHUB, "on.phrase", "on.phrase must be"),
    ({"type": "pull_request", "action": ["opened"]}, {"kind": "gitlab", "flow": "x"}, "on.action",
     "not a gitlab pull request action; gitlab allows: open, update, reopen, approved, close"),
    ({"type": "pull_request", "action": ["label_cleared"]}, {"kind": "forgejo", "flow": "x"}, "on.action",
     "not a forgejo pull request action"),
    ({"type": "pull_request", "action": []}, GITHUB, "on.action", "must not be empty"),
    ({"type": "pull_request"}, GITHUB, "on.action", "on.action is required"),
    ({"type": "pull_request", "action": ["closed", "opened"]}, GITHUB, "on.action", "must be the rule's only action"),
    ({"type": "pull_request", "action": ["labeled"]}, GITHUB, "on.any", "needs a positive selector"),
    ({"type": "pull_request", "action": ["label_updated"], "none": ["x"]}, {"kind": "forgejo", "flow": "x"}, "on.any",
     "needs a positive selector"),
    ({"type": "pull_request", "action": ["created"], "any": ["x"]}, {"kind": "azure", "flow": "x"}, "on.any",
     "Azure DevOps pull requests have no labels"),
    ({"type": "pull_request", "action": ["closed"], "any": ["x"]}, GITHUB, "on.any", "close-only"),
    ({"type": "pull_request", "action": ["opened"], "reviewState": ["approved"]}, GITHUB, "on.reviewState",
     "needs 'review_submitted'"),
    ({"type": "pull_request", "action": ["review_submitted"], "reviewState": ["lgtm"]}, GITHUB, "on.reviewState",
     "drawn from approved, changes_requested, commented"),
    ({"type": "pull_request", "action": ["update"], "reviewState": ["approved"]}, {"kind": "gitlab", "flow": "x"},
     "on.reviewState", "only for GitHub"),
    ({"type": "issue", "action": ["closed"], "any": ["x"]}, GITHUB, "on.any", "no label predicate"),
    ({"type": "issue", "action": ["closed"]}, {"kind": "azure", "flow": "x"}, "run.kind", "not available for Azure"),
    ({"type": "pull_request", "action": ["opened"], "number": 3}, GITHUB, "on.number", "only for close rules"),
    ({"type": "issue", "action": ["closed"], "number": 0}, GITHUB, "on.number", ">= 1"),
    ({"type": "issue", "action": ["closed"], "number": True}, GITHUB, "on.number", ">= 1"),
    ({"type": "issue", "action": ["closed"], "once": True}, GITHUB, "on.once", "needs on.number"),
    ({"type": "issue", "action": ["closed"], "once": "yes", "number": 1}, GITHUB, "on.once", "true or false"),
    ({"type": "issue", "action": ["closed"], "number": 1, "disarmed": {"at": "2026-01-01T00:00:00Z"}}, GITHUB,
     "on.disarmed", "only exists beside on.once"),
    ({"type": "issue", "action": ["closed"], "number": 1, "once": True, "disarmed": {"at": "yesterday"}}, GITHUB,
     "on.disarmed", "ISO 8601"),
    ({"type": "label", "phrase": "@pi", "any": ["x"]}, GITHUB, "on.phrase", "not used by label triggers"),
    (LABEL, {**GITHUB, "instructions": "x" * 2001}, "run.instructions", "at most 2000"),
    (LABEL, {"kind": "github", "command": "retro", "instructions": "hi"}, "run.instructions", "cannot be combined"),
    (LABEL, {**GITHUB, "replicas": 1}, "run.replicas", "from 2 to 3"),
    (LABEL, {**GITHUB, "replicas": 4}, "run.replicas", "from 2 to 3"),
    (LABEL, {**GITHUB, "replicas": 2, "resume": True}, "run.resume", "run.replicas"),
    ({"type": "issue", "action": ["closed"], "number": 1, "once": True}, {**GITHUB, "replicas": 2}, "run.replicas",
     "on.once"),
    (LABEL, {**GITHUB, "waitFor": [{"after": "2026-12-01T09:00:00"}]}, "run.waitFor", "with its zone"),
    (LABEL, {**GITHUB, "waitFor": [{"after": "2026-02-31T09:00:00Z"}]}, "run.waitFor", "with its zone"),
    (LABEL, {**GITHUB, "waitFor": [{"profile": "a"}, {"profile": "a"}]}, "run.waitFor", "listed twice"),
    (LABEL, {**GITHUB, "waitFor": [{"exclusive": True}]}, "run.waitFor", "scoped limit"),
    (LABEL, {**GITHUB, "waitFor": [{"until": "x"}]}, "run.waitFor", "not a wait condition"),
    (LABEL, {**GITHUB, "waitFor": [{"profile": "a"}] * 5}, "run.waitFor", "1 to 4"),
    (LABEL, {**GITHUB, "waitFor": [{"profile": "a"}], "replicas": 2}, "run.waitFor", "run.replicas"),
    ({"type": "cron", "id": "n", "pattern": "0 3 * * *"},
     {"kind": "local", "folder": "/x", "flow": "f", "task": "t", "waitFor": [{"profile": "a"}]}, "run.waitFor",
     "not cron"),
    (LABEL, {**GITHUB, "secrets": {"GITHUB_TOKEN": "vault/x"}}, "run.secrets", "set by the runtime"),
    (LABEL, {**GITHUB, "secrets": {"ANTHROPIC_API_KEY": "vault/x"}}, "run.secrets", "set by the runtime"),
    (LABEL, {**GITHUB, "secrets": {"pi_model": "vault/x"}}, "run.secrets", "set by the runtime"),
    (LABEL, {**GITHUB, "secrets": {"PI_MODEL": "vault/x"}}, "run.secrets", "set by the runtime"),
    (LABEL, {**GITHUB, "secrets": {"9BAD": "vault/x"}}, "run.secrets", "not an environment variable"),
    (LABEL, {**GITHUB, "secrets": {"OK": " padded"}}, "run.secrets", "surrounding spaces"),
    (LABEL, {**GITHUB, "secrets": {}}, "run.secrets", "1 to 16"),
    (LABEL, {**GITHUB, "secretsProfile": "vault"}, "run.secretsProfile", "needs run.secrets"),
    (LABEL, {**GITHUB, "repository": "web"}, "run.repository", "only for Azure"),
    ({"type": "label", "any": ["x"]}, {"kind": "azure", "flow": "x"}, "run.repository", "required for Azure"),
    ({"type": "label", "any": ["x"]}, {"kind": "azure", "flow": "x", "repository": "a/b"}, "run.repository",
     "required for Azure"),
    (LABEL, {**GITHUB, "excludeTools": ["rm"]}, "run.excludeTools", "drawn from read, bash"),
    (LABEL, {**GITHUB, "provider": "-x"}, "run.provider", "starting with a letter"),
    (LABEL, {**GITHUB, "model": "claude sonnet"}, "run.model", "letters, digits"),
    (LABEL, {**GITHUB, "maxTurns": 0}, "run.maxTurns", "a whole number of turns, at least 1"),
    (LABEL, {**GITHUB, "image": " pi:1"}, "run.image", "surrounding spaces"),
    (LABEL, {**GITHUB, "task": "do it"}, "run.task", "only for cron"),
    ({"type": "cron", "id": "a:b", "pattern": "0 3 * * *"}, {"kind": "local", "folder": "/x", "command": "c"},
     "on.id", "no ':'"),
    ({"type": "cron", "id": "n", "pattern": "0 3 * *"}, {"kind": "local", "folder": "/x", "command": "c"},
     "on.pattern", "5 or 6 space-separated fields (it has 4)"),
    ({"type": "cron", "id": "n", "pattern": "61 25 * * *"}, {"kind": "local", "folder": "/x", "command": "c"},
     "on.pattern", "minute field is 61, out of its range 0-59"),
    ({"type": "cron", "id": "n", "pattern": "0 25 * * *"}, {"kind": "local", "folder": "/x", "command": "c"},
     "on.pattern", "hour field is 25, out of its range 0-23"),
    ({"type": "cron", "id": "n", "pattern": "0 0 6 * * 9"}, {"kind": "local", "folder": "/x", "command": "c"},
     "on.pattern", "day of the week field is 9"),
    ({"type": "cron", "id": "n", "pattern": "0 3 * * *"}, {"kind": "local", "flow": "f"}, "run.folder", "required"),
    ({"type": "cron", "id": "n", "pattern": "0 3 * * *"}, {"kind": "local", "folder": "/x", "flow": "f"}, "run.task",
     "required beside run.flow"),
    ({"type": "cron", "id": "n", "pattern": "0 3 * * *"}, {"kind": "local", "folder": "/x", "command": "c",
                                                            "task": "t"}, "run.task", "cannot be combined"),
    ({"type": "cron", "id": "n", "pattern": "0 3 * * *"}, {"kind": "local", "folder": "/x", "command": "c",
                                                            "resume": True}, "run.resume",
     "cannot be combined with run.command"),
])
def test_each_rule_is_named_in_its_error(on, run, path, fragment):
    assert_refused(on, run, path, fragment)


def test_resume_is_a_flows_continuation_on_any_target_a_cron_triggers_too():
    cron = {"type": "cron", "id": "nightly", "pattern": "0 3 * * *"}
    assert problems(cron, {"kind": "local", "folder": "/x", "flow": "f", "task": "t", "resume": True}) == []
    assert problems(LABEL, {**GITHUB, "resume": True}) == []
    for other, value in (("replicas", 2), ("secrets", {"TOKEN": "ref"}), ("command", "c")):
        run = {**GITHUB, "resume": True, other: value}
        if other == "command":
            del run["flow"]
        assert_refused(LABEL, run, "run.resume", f"cannot be combined with run.{other}")


@pytest.mark.parametrize("key, path, fragment", [
    ("max_turns", "run.max_turns", "looks like run.maxTurns"),
    ("MaxTurns", "run.MaxTurns", "looks like run.maxTurns"),
    ("wait_for", "run.wait_for", "looks like run.waitFor"),
    ("exclude-tools", "run.exclude-tools", "looks like run.excludeTools"),
    ("excludedTools", "run.excludedTools", "did you mean run.excludeTools"),
    ("tools", "run.tools", "did you mean run.excludeTools"),
    ("noTools", "run.noTools", "did you mean run.excludeTools"),
    ("modelId", "run.modelId", "did you mean run.model"),
    ("maxTurn", "run.maxTurn", "did you mean run.maxTurns"),
    ("backEnd", "run.backEnd", "looks like run.backend"),
    ("maxCost", "run.maxCost", "did you mean run.maxCostUsd"),
    ("max_cost_usd", "run.max_cost_usd", "looks like run.maxCostUsd"),
    ("allowedModels", "run.allowedModels", "did you mean run.models"),
    ("Models", "run.Models", "looks like run.models"),
    ("portfolio", "run.portfolio", "are not built yet"),
    ("skills_dir", "run.skills_dir", "looks like run.skillsDir"),
    ("Backends", "run.Backends", "did you mean run.backend"),
])
def test_near_misses_that_would_silently_do_nothing_are_refused(key, path, fragment):
    assert_refused(LABEL, {**GITHUB, key: 1}, path, fragment)


@pytest.mark.parametrize("value, fragment", [(0, "must be more than 0"), ("1e2", "plain number"),
                                             ("-5", "is negative"), (-0.5, "is negative"),
                                             ("0.0000001", "at most 6 decimals"), (None, "must be set")])
def test_a_bad_dollar_cap_names_the_rule(value, fragment):
    assert_refused(LABEL, {**GITHUB, "maxCostUsd": value}, "run.maxCostUsd", fragment)


def test_a_rules_dollar_cap_reaches_its_jobs_and_round_trips(tmp_path):
    from decimal import Decimal

    from apps.receiver.run_keys import job_fields

    document = {"triggers": [{"on": LABEL, "run": {**GITHUB, "maxCostUsd": "0.75"}}]}
    (tmp_path / "t.json").write_text(json.dumps(document))
    run_command("import_triggers", str(tmp_path / "t.json"))
    rule = Trigger.objects.get()
    assert rule.max_cost_usd == Decimal("0.75")
    assert job_fields(rule)["max_cost_usd"] == "0.750000"
    exported, _ = run_command("export_triggers")
    assert json.loads(exported)["triggers"][0]["run"]["maxCostUsd"] == "0.75"


@pytest.mark.parametrize("models, fragment", [
    ([], "1 to 16 provider/model entries"),
    ("anthropic/claude-sonnet-4-5", "1 to 16 provider/model entries"),
    ([f"anthropic/model-{n}" for n in range(17)], "1 to 16 provider/model entries"),
    (["claude-sonnet-4-5"], "'claude-sonnet-4-5' is not provider/model"),
    (["anthropic/"], "is not provider/model"),
    (["anthropic/~sonnet"], "is not provider/model"),
    (["anthropic/claude-*"], "is not provider/model"),
    ([7], "is not a provider/model text"),
    (["anthropic/claude-sonnet-4-5", "Anthropic/Claude-Sonnet-4-5"], "twice"),
])
def test_a_bad_model_list_names_the_key_and_the_rule(models, fragment):
    assert_refused(LABEL, {**GITHUB, "models": models}, "run.models", fragment)


def test_the_main_model_must_be_on_the_list_when_both_are_set():
    run = {**GITHUB, "provider": "anthropic", "model": "claude-opus-4-1", "models": ["anthropic/claude-sonnet-4-5"]}
    assert_refused(LABEL, run, "run.models", "run.models does not list the main model anthropic/claude-opus-4-1")
    assert problems(LABEL, {**run, "models": ["anthropic/claude-sonnet-4-5", "Anthropic/Claude-Opus-4-1"]}) == []
    # Without a provider the main model's provider is the deployment's: the worker checks it before any spend.
    assert problems(LABEL, {**GITHUB, "model": "claude-opus-4-1", "models": ["anthropic/claude-sonnet-4-5"]}) == []


def test_a_rules_model_list_reaches_its_jobs_and_round_trips(tmp_path):
    from apps.receiver.run_keys import job_fields

    listed = ["anthropic/claude-sonnet-4-5", "openrouter/anthropic/claude-haiku-4.5"]
    cron = {"type": "cron", "id": "nightly", "pattern": "0 3 * * *"}
    document = {"triggers": [{"on": LABEL, "run": {**GITHUB, "models": listed}},
                             {"on": cron, "run": {"kind": "local", "folder": "/srv/x", "flow": "tidy", "task": "t",
                                                  "models": listed[:1]}}]}
    (tmp_path / "t.json").write_text(json.dumps(document))
    run_command("import_triggers", str(tmp_path / "t.json"))
    label_rule, cron_rule = Trigger.objects.order_by("position")
    assert label_rule.allowed_models == listed and cron_rule.allowed_models == listed[:1]
    assert job_fields(label_rule)["models"] == tuple(listed)
    exported, _ = run_command("export_triggers")
    assert [entry["run"]["models"] for entry in json.loads(exported)["triggers"]] == [listed, listed[:1]]


def test_an_import_with_a_bad_model_list_changes_nothing_and_names_the_key(tmp_path):
    document = {"triggers": [{"on": LABEL, "run": {**GITHUB, "model": "claude-opus-4-1", "provider": "anthropic",
                                                   "models": ["anthropic/claude-sonnet-4-5"]}}]}
    (tmp_path / "t.json").write_text(json.dumps(document))
    with pytest.raises(CommandError, match="run.models does not list the main model"):
        run_command("import_triggers", str(tmp_path / "t.json"))
    assert Trigger.objects.count() == 0


def test_wait_for_under_on_is_refused_in_any_spelling():
    for key in ("waitFor", "wait_for", "WAITFOR"):
        assert_refused({**LABEL, key: [{"profile": "x"}]}, GITHUB, f"on.{key}", "belongs under run")


def test_near_misses_under_on_point_at_the_on_key():
    assert_refused({"type": "pull_request", "action": ["opened"], "actions": ["opened"]}, GITHUB, "on.actions",
                   "did you mean on.action?")
    assert_refused({"type": "pull_request", "action": ["opened"], "review_state": ["approved"]}, GITHUB,
                   "on.review_state", "looks like on.reviewState")


def test_unknown_keys_are_dropped_with_a_warning():
    parsed = triggerfile.parse(json.dumps({"triggers": [{"on": {**LABEL, "colour": "red"}, "run": {**GITHUB, "x": 1},
                                                         "comment": "hi"}]}))
    assert parsed.warnings == [
        "trigger at index 0: on.colour is not a trigger field and is ignored",
        "trigger at index 0: run.x is not a trigger field and is ignored",
        "trigger at index 0: comment is not a trigger field and is ignored",
    ]


@pytest.mark.parametrize("text, fragment", [
    ("{not json", "not valid JSON"),
    ('{"triggers": {}}', '"triggers" array'),
    ("[]", '"triggers" array'),
    ('{"triggers": [{"on": {"type": "label", "type": "comment"}, "run": {}}]}', "repeats the key 'type'"),
    ('{"triggers": [7]}', "trigger at index 0: a trigger must be an object"),
    ('{"triggers": [{"on": [], "run": {}}]}', "trigger at index 0: on must be an object"),
])
def test_file_level_refusals(text, fragment):
    with pytest.raises(triggerfile.TriggerFileError) as refused:
        triggerfile.parse(text)
    assert any(fragment in problem for problem in refused.value.problems), refused.value.problems


def test_one_comment_trigger_per_forge_and_unique_cron_ids():
    comment = {"on": {"type": "comment", "phrase": "@pi"}, "run": GITHUB}
    cron = {"on": {"type": "cron", "id": "n", "pattern": "0 3 * * *"}, "run": {"kind": "local", "folder": "/x",
                                                                              "command": "c"}}
    other_forge = {"on": {"type": "comment", "phrase": "@pi"}, "run": {"kind": "gitlab", "flow": "x"}}
    with pytest.raises(triggerfile.TriggerFileError) as refused:
        triggerfile.parse(json.dumps({"triggers": [comment, other_forge, comment, cron, cron]}))
    assert refused.value.problems == [
        "trigger at index 2: a second comment trigger for github (the first is at index 0): one comment trigger per "
        "forge; a comment picks another flow with `<phrase> <flow>`.",
        "trigger at index 4: cron id 'n' is already used at index 3; cron ids are unique.",
    ]


# --- import / export --------------------------------------------------------------------------------------------

def run_command(*args):
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_import_then_export_round_trips_the_ancestors_file(tmp_path):
    out, _ = run_command("import_triggers", str(ANCESTOR))

    assert "imported 15 trigger(s): 15 created, 0 updated, 0 removed" in out
    assert list(Trigger.objects.values_list("position", flat=True)) == list(range(15))
    exported, _ = run_command("export_triggers")
    original = json.loads(ANCESTOR.read_text())
    del original["triggers"][0]["run"]["resume"]  # `resume: false` is the default; it is written as absent
    assert json.loads(exported) == original

    again = tmp_path / "again.json"
    run_command("export_triggers", str(again))
    assert json.loads(again.read_text()) == json.loads(exported)


def test_reimport_updates_rows_in_place_so_history_keeps_its_rules():
    run_command("import_triggers", str(ANCESTOR))
    ids = list(Trigger.objects.order_by("position").values_list("id", flat=True))

    out, _ = run_command("import_triggers", str(ANCESTOR))

    assert "0 created, 15 updated, 0 removed" in out
    assert list(Trigger.objects.order_by("position").values_list("id", flat=True)) == ids


def test_a_shorter_file_removes_the_rules_beyond_it(tmp_path):
    run_command("import_triggers", str(ANCESTOR))
    short = tmp_path / "short.json"
    short.write_text(json.dumps({"triggers": json.loads(ANCESTOR.read_text())["triggers"][:3]}))

    out, _ = run_command("import_triggers", str(short))

    assert "0 created, 3 updated, 12 removed" in out and Trigger.objects.count() == 3


def test_a_bad_file_changes_nothing_and_says_why(tmp_path):
    run_command("import_triggers", str(ANCESTOR))
    before = json.loads(run_command("export_triggers")[0])
    document = json.loads(ANCESTOR.read_text())
    document["triggers"][1]["run"]["replicas"] = 7
    document["triggers"][4]["run"]["max_turns"] = 3
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(document))

    with pytest.raises(CommandError) as refused:
        run_command("import_triggers", str(bad))

    message = str(refused.value)
    assert "not imported, nothing changed. 2 problem(s)" in message
    assert "trigger at index 1: run.replicas must be a whole number from 2 to 3" in message
    assert "trigger at index 4: run.max_turns looks like run.maxTurns" in message
    assert json.loads(run_command("export_triggers")[0]) == before


def test_missing_file_and_dry_run(tmp_path):
    with pytest.raises(CommandError, match="no such file"):
        run_command("import_triggers", str(tmp_path / "nope.json"))
    out, _ = run_command("import_triggers", str(ANCESTOR), "--dry-run")
    assert "15 trigger(s) are valid (dry run" in out and Trigger.objects.count() == 0


def test_imported_disarm_mark_and_rearming_by_file(tmp_path):
    run_command("import_triggers", str(ANCESTOR))
    spent = Trigger.objects.get(position=5)
    assert spent.disarmed and spent.disarmed_job_id == "gh-5f2c" and spent.armed_at is not None

    document = json.loads(ANCESTOR.read_text())
    del document["triggers"][5]["on"]["disarmed"]
    rearmed = tmp_path / "rearmed.json"
    rearmed.write_text(json.dumps(document))
    out, _ = run_command("import_triggers", str(rearmed))

    assert "trigger at index 5: the file has no on.disarmed, so this spent one-shot rule is armed again" in out
    spent.refresh_from_db()
    assert not spent.disarmed


def test_disabled_rules_and_notes_survive_the_round_trip():
    run_command("import_triggers", str(ANCESTOR))
    Trigger.objects.filter(position=3).update(enabled=False, note="paused during the freeze")

    exported = json.loads(run_command("export_triggers")[0])

    assert exported["triggers"][3]["enabled"] is False
    assert exported["triggers"][3]["note"] == "paused during the freeze"


def test_names_survive_the_round_trip_and_a_bad_one_is_refused(tmp_path):
    run_command("import_triggers", str(ANCESTOR))
    Trigger.objects.filter(position=2).update(name="Review labelled pull requests")

    exported = json.loads(run_command("export_triggers")[0])
    assert exported["triggers"][2]["name"] == "Review labelled pull requests"
    assert "name" not in exported["triggers"][0]  # no name, no key: the ancestor's file stays its own

    path = tmp_path / "named.json"
    path.write_text(json.dumps(exported))
    Trigger.objects.all().update(name="")
    run_command("import_triggers", str(path))
    assert Trigger.objects.get(position=2).name == "Review labelled pull requests"

    exported["triggers"][1]["name"] = ["not", "text"]
    path.write_text(json.dumps(exported))
    with pytest.raises(CommandError, match="trigger at index 1: name must be text of at most 100 characters"):
        run_command("import_triggers", str(path))
    assert Trigger.objects.get(position=1).name == ""  # nothing changed


# --- the admin uses the same validation --------------------------------------------------------------------------

def admin_form(**overrides):
    data = {"position": 0, "enabled": "on", "note": "", "on_type": "label", "cron_id": "", "cron_pattern": "",
            "label_any": '["pi"]', "label_all": "[]", "label_none": "[]", "phrase": "", "actions": "[]",
            "review_states": "[]", "number": "", "kind": "github", "flow": "fix-bug", "command": "", "task": "",
            "folder": "", "image": "", "instructions": "", "replicas": "", "wait_for": "[]", "secrets": "{}",
            "secrets_profile": "", "repository": "", "exclude_tools": "[]", "provider": "", "model": "",
            "max_turns": ""}
    data.update(overrides)
    return data


def test_admin_refuses_what_the_importer_refuses(admin_client):
    page = admin_client.post("/admin/receiver/trigger/add/", admin_form(
        on_type="pull_request", actions='["opened"]', kind="gitlab", label_any="[]")).content.decode()
    assert "not a gitlab pull request action" in page and Trigger.objects.count() == 0

    page = admin_client.post("/admin/receiver/trigger/add/", admin_form(max_turns="0")).content.decode()
    assert "“Max turns” must be a whole number" in page or "Ensure this value is greater" in page


def test_admin_edits_a_rules_dollar_cap_with_the_importers_rule(admin_client):
    from decimal import Decimal

    page = admin_client.post("/admin/receiver/trigger/add/", admin_form(max_cost_usd="0")).content.decode()
    assert "“Most dollars per run” must be more than 0" in page and Trigger.objects.count() == 0
    assert admin_client.post("/admin/receiver/trigger/add/", admin_form(max_cost_usd="1.25")).status_code == 302
    assert Trigger.objects.get().max_cost_usd == Decimal("1.25")


def test_admin_edits_a_rules_model_list_with_the_importers_rule(admin_client):
    page = admin_client.post("/admin/receiver/trigger/add/", admin_form(
        provider="anthropic", model="claude-opus-4-1", allowed_models="anthropic/claude-sonnet-4-5")).content.decode()
    assert "“Allowed models” does not list the main model anthropic/claude-opus-4-1" in page
    assert Trigger.objects.count() == 0
    page = admin_client.post("/admin/receiver/trigger/add/", admin_form(allowed_models="sonnet")).content.decode()
    assert "“Allowed models”: &#x27;sonnet&#x27; is not provider/model" in page and Trigger.objects.count() == 0
    assert admin_client.post("/admin/receiver/trigger/add/", admin_form(
        allowed_models="anthropic/claude-sonnet-4-5, anthropic/claude-haiku-4-5")).status_code == 302
    assert Trigger.objects.get().allowed_models == ["anthropic/claude-sonnet-4-5", "anthropic/claude-haiku-4-5"]


def test_admin_refuses_a_second_comment_trigger_for_a_forge(admin_client):
    assert admin_client.post("/admin/receiver/trigger/add/", admin_form(
        on_type="comment", phrase="@pi", label_any="[]")).status_code == 302

    page = admin_client.post("/admin/receiver/trigger/add/", admin_form(
        on_type="comment", phrase="@bot", label_any="[]")).content.decode()

    assert "already a comment trigger for github" in page and Trigger.objects.count() == 1


def test_admin_creates_an_armed_one_shot_and_rearms_a_spent_one(admin_client):
    from django.utils import timezone

    response = admin_client.post("/admin/receiver/trigger/add/", admin_form(
        on_type="issue", actions='["closed"]', number="42", once="on", label_any="[]"))
    assert response.status_code == 302
    rule = Trigger.objects.get()
    assert rule.once and rule.armed_at is not None and not rule.disarmed

    first_arming = rule.armed_at
    Trigger.objects.filter(pk=rule.pk).update(disarmed_at=timezone.now(), disarmed_job_id="gh-spent")
    listing = admin_client.get("/admin/receiver/trigger/?one_shot=disarmed").content.decode()
    assert "disarmed" in listing and "gh-spent" in listing

    response = admin_client.post("/admin/receiver/trigger/", {
        "action": "rearm_selected", "_selected_action": [rule.pk]}, follow=True)

    assert "1 one-shot rule(s) re-armed" in response.content.decode()
    rule.refresh_from_db()
    assert not rule.disarmed and rule.disarmed_job_id == "" and rule.armed_at > first_arming
