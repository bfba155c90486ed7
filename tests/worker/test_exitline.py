"""The exit line is untrusted: only well-formed, bounded values become telemetry; nothing can crash."""

import json
from decimal import Decimal

import pytest

from apps.worker.sandbox.exitline import MAX_LINE_BYTES, parse_exit_line


def line(**fields) -> bytes:
    return json.dumps({"event": "exit", **fields}, separators=(",", ":")).encode()


GOOD = dict(turns=3, tokens={"input": 100, "output": 20, "total": 120, "cost": 0.5},
            usage={"v": 1, "models": [{"provider": "Anthropic", "model": "claude-x", "calls": 3, "input": 100,
                                       "output": 20, "total": 120, "cost": "0.5"}]})


def test_reads_the_last_exit_line_after_other_output():
    output = b'{"event":"turn","n":1}\n' + line(turns=1) + b"\nnoise\n" + line(**GOOD) + b"\n"

    telemetry = parse_exit_line(output, 0)

    assert (telemetry.turns, telemetry.tokens_in, telemetry.tokens_out, telemetry.tokens_total) == (3, 100, 20, 120)
    assert telemetry.cost == Decimal("0.500000")
    assert telemetry.usage == {"models": [{"provider": "anthropic", "model": "claude-x", "calls": 3, "input": 100,
                                           "output": 20, "total": 120, "cost": "0.500000"}]}


@pytest.mark.parametrize(
    "output",
    [
        b"",
        b"no json at all",
        b'{"event":"exit",',
        b'{"event":"exit","turns":3',
        b'{"event":"exit"}' + b" " * (MAX_LINE_BYTES + 10) + b"x",
        b'{"event":"exit","turns":' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"event":"exit","turns":1e999}',
        b"\xff\xfe{\"event\":\"exit\"}",
    ],
)
def test_malformed_exit_lines_never_raise(output):
    telemetry = parse_exit_line(output, 0)
    assert telemetry.usage is None


@pytest.mark.parametrize(
    "fields",
    [
        dict(turns=-1), dict(turns="3"), dict(turns=True), dict(turns=10**7),
        dict(tokens={"input": -5}), dict(tokens={"input": 1.5}), dict(tokens={"cost": "NaN"}),
        dict(tokens={"cost": -1}), dict(tokens={"cost": 10**9}),
    ],
)
def test_out_of_range_numbers_are_dropped(fields):
    telemetry = parse_exit_line(line(**fields), 0)
    assert telemetry.turns is None and telemetry.tokens_in is None and telemetry.cost is None


@pytest.mark.parametrize(
    "usage",
    [
        {"models": []},
        {"models": "x"},
        {"models": [{"provider": "a", "model": "b"}] * 10},
        {"models": [{"provider": "A B", "model": "b"}]},
        {"models": [{"provider": "a", "model": "b" * 65}]},
        {"models": [{"provider": "a", "model": "b", "input": -1}]},
        {"models": [{"provider": "a", "model": "b", "cost": "free"}]},
    ],
)
def test_any_bad_ledger_row_drops_the_whole_ledger(usage):
    assert parse_exit_line(line(usage=usage, turns=2), 0).usage is None


def test_reason_is_read_only_for_exit_2_and_only_from_the_closed_set():
    assert parse_exit_line(line(reason="cost-cap"), 2).reason == "cost-cap"
    assert parse_exit_line(line(reason="cost-cap"), 0).reason is None
    assert parse_exit_line(line(reason="rm -rf /"), 2).reason is None
