"""`ladder.GATES` is the one statement of the gate order: the ladder's docstring, docs/architecture.md's table, the
run page's phases and the reasons the operator and the forge are told about are held to it here, and each step
may end a climb only with a reason its gate declares."""

import ast
import inspect
import re
import textwrap
from pathlib import Path

import pytest

from apps.worker import reasons
from apps.worker.forges import comments
from apps.worker.gates import ladder
from apps.worker.gates.ladder import GATES
from apps.worker.progress import reading

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
STOP_CLASSES = {"GateRefusal": "refuses", "GateFault": "retries", "GateDeferral": "defers"}


def documented_rows() -> list[dict]:
    """docs/architecture.md §2's table: each row's number and the reason tokens of its three last columns (what a
    parenthesis says about a token, or a path or setting named in one, is not a reason)."""
    section = ARCHITECTURE.read_text().split("## 2. The gate ladder", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 6 or not re.fullmatch(r"\d+[a-z]?", cells[0]):
            continue
        tokens = {}
        for column, cell in zip(("defers", "refuses", "retries"), cells[3:], strict=True):
            while re.search(r"\([^()]*\)", cell):
                cell = re.sub(r"\([^()]*\)", "", cell)
            tokens[column] = {token for token in re.findall(r"`([^`]+)`", cell)
                              if re.fullmatch(r"[a-z][a-z0-9-]*\*?", token)}
        rows.append({"number": cells[0], **tokens})
    return rows


def test_the_architecture_document_lists_every_gate_in_the_tables_order_with_its_reasons():
    rows = documented_rows()
    assert [row["number"] for row in rows] == [gate.number for gate in GATES]
    for row, gate in zip(rows, GATES, strict=True):
        assert row["defers"] == set(gate.defers), gate.number
        assert row["refuses"] == set(gate.refuses), gate.number
        assert row["retries"] == set(gate.retries), gate.number


def test_the_ladders_docstring_names_the_gates_in_the_tables_order():
    order = ladder.__doc__.split("The order:", 1)[1].split(".", 1)[0]
    named = [re.match(r"(\d+[a-z]?) (.+)", part.strip()).groups() for part in " ".join(order.split()).split(",")]
    assert named == [(gate.number, gate.name) for gate in GATES]


def test_every_phase_the_worker_writes_has_the_words_the_run_page_shows():
    gate_phases = [gate.phase for gate in GATES if gate.phase]
    assert len(gate_phases) == len(set(gate_phases)), "a phase token names one gate"
    for gate in GATES:
        assert bool(gate.phase) == bool(gate.phase_label), gate.number
    for token in ("queued", "picked-up", *gate_phases, "recorded"):
        assert reading.phase_label(token) != token or token == "queued"
    assert reading.phase_label("deferred:scope-busy") == "deferred (scope-busy)"


def test_every_reason_a_gate_declares_is_explained_to_the_operator_and_each_refusal_to_the_forge():
    # Only a local job meets these, and a local job has no forge to tell.
    local_only = {"workspace-config-unsafe", "github-remote-missing", "github-remote-mismatch",
                  "github-start-unpublished"}
    sentences = set(comments.REFUSED) | set(comments.STOPPED)
    for gate in GATES:
        for token in (*gate.refuses, *gate.retries):
            if token.endswith("*"):
                assert any(known.startswith(token[:-1]) for known in reasons.REASONS), token
                continue
            assert token in reasons.REASONS, f"gate {gate.number}: {token} is not explained (apps/worker/reasons.py)"
            if token in gate.refuses and token not in local_only:
                assert token in sentences, f"gate {gate.number}: {token} has no forge sentence"


def literal_stops(function) -> set[tuple[str, str]]:
    """The (kind, reason) of every GateStop `function` raises with a literal reason, and those of the functions of
    its own module it calls, transitively."""
    module = inspect.getmodule(function)
    seen, found, todo = set(), set(), [function]
    while todo:
        current = todo.pop()
        if current.__name__ in seen:
            continue
        seen.add(current.__name__)
        tree = ast.parse(textwrap.dedent(inspect.getsource(current)))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                continue
            name = node.func.id
            if name in STOP_CLASSES:
                position = 1 if name == "GateDeferral" else 0
                if len(node.args) > position and isinstance(node.args[position], ast.Constant):
                    found.add((STOP_CLASSES[name], node.args[position].value))
            elif inspect.isfunction(getattr(module, name, None)):
                todo.append(getattr(module, name))
    return found


@pytest.mark.parametrize("gate", GATES, ids=[gate.number for gate in GATES])
def test_a_step_ends_a_climb_only_with_a_reason_its_gate_declares(gate):
    for kind, reason in literal_stops(gate.step):
        assert reason in getattr(gate, kind), f"gate {gate.number} ({gate.step.__name__}) {kind} {reason}"


def test_the_static_check_finds_the_reasons_a_step_raises():
    # The check above sees through a step into its module's helpers (gate 8b's is served_models).
    assert ("refuses", "model-not-allowed") in literal_stops(ladder.steps.allowed_model_list)
    assert ("defers", "scope-busy") in literal_stops(ladder.steps.slots)


def test_a_stop_ends_the_climb_as_its_outcome_and_an_undeclared_reason_is_logged_as_a_defect(monkeypatch, caplog):
    from types import SimpleNamespace

    from apps.worker.gates.verdicts import GateRefusal

    def stray(attempt):
        raise GateRefusal("brand-new-reason")

    climbed = []
    monkeypatch.setattr(ladder, "GATES", (ladder.Gate("1", "first", climbed.append, phase="first", phase_label="x"),
                                          ladder.Gate("2", "stray", stray, refuses=("declared-one",))))
    attempt = SimpleNamespace(spec=SimpleNamespace(job_id="gh-table-1"), passed=climbed.append, verdict=None)
    with caplog.at_level("ERROR", logger="pidispatch.ladder"):
        outcome = ladder._climb(attempt)

    assert (outcome.outcome, outcome.reason) == ("policy", "brand-new-reason")
    assert climbed == [attempt, "first"]
    assert "gate_reason_undeclared job=gh-table-1 gate=2 reason=brand-new-reason" in caplog.text


def test_a_family_of_reasons_is_declared_by_its_prefix():
    workspace = next(gate for gate in GATES if gate.number == "10")
    assert workspace.ends_with("pi-too-deep") and workspace.ends_with("workspace-dirty")
    assert not workspace.ends_with("pix-too-deep") and not workspace.ends_with("scope-busy")


def test_every_reason_a_workspace_can_be_refused_or_failed_with_is_declared_by_the_workspace_gate():
    # The workspace gate (10) turns WorkspaceRefused and ForgeFailure into its stops: each literal reason of theirs in
    # the modules it calls is one it declares. Only opening a pull request (publishing, gate 14) raises the exception.
    publishing_only = {"pull-request-conflict"}
    root = Path(__file__).resolve().parents[2] / "apps" / "worker"
    sources = [*root.glob("sandbox/*.py"), *root.glob("forges/*.py")]
    raised = {reason for path in sources
              for reason in re.findall(r"(?:WorkspaceRefused|ForgeFailure)\(\s*\"([a-z0-9-]+)\"", path.read_text())}
    workspace = next(gate for gate in GATES if gate.number == "10")
    assert "default-branch-missing" in raised and "workspace-dirty" in raised
    assert {reason for reason in raised - publishing_only if not workspace.ends_with(reason)} == set()


def test_a_release_that_fails_is_logged_by_its_type_alone_and_the_others_still_run(caplog):
    from django.utils import timezone

    from apps.worker.gates.attempt import Attempt
    from apps.worker.jobs import JobSpec

    spec = JobSpec(job_id="gh-release-1", kind="github", flow="fix-bug")
    attempt = Attempt(spec=spec, host="hostA", now=timezone.now(), redis=None)
    released = []

    def revoke():
        raise RuntimeError("revoking https://x-access-token:ghs_secret123@forge.example failed")

    attempt.hold("first", lambda: released.append("first"))
    attempt.hold("forge-token", revoke)
    attempt.hold("last", lambda: released.append("last"))
    with caplog.at_level("WARNING", logger="pidispatch.ladder"):
        attempt.ended(None)

    assert released == ["last", "first"]  # last taken, first given back; the failure stopped nothing
    assert "attempt_release_failed job=gh-release-1 hold=forge-token error=RuntimeError" in caplog.text
    assert "ghs_secret123" not in caplog.text
