"""The runner's last stdout line, `{"event":"exit", ...}`: untrusted input, re-validated field by field.

Anything odd yields no telemetry; nothing here can raise. Telemetry never changes how a run is classified
(only the exit code does); the `reason` is read only for exit code 2, and only from a closed set.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

MARKER = b'{"event":"exit"'
SUMMARY_MARKER = b'{"event":"summary"'
MAX_LINE_BYTES = 8 * 1024
SUMMARY_CHARS = 8000  # the runner's bound (image/runner/runner.mjs SUMMARY_CHARS)
MAX_SUMMARY_LINE_BYTES = 6 * SUMMARY_CHARS + 64  # every character escaped as \uXXXX
MAX_COUNT = 10**12
MAX_TURNS = 10**6
MAX_COST = Decimal("1000000")
MAX_MODEL_ROWS = 9
MODEL_ID = re.compile(r"^[a-z0-9][a-z0-9._:/-]{0,63}$")
USAGE_NUMBERS = ("calls", "input", "output", "cacheRead", "cacheWrite", "reasoning", "total")

# Reasons a runner may give for exit 2; anything else becomes `runner-policy`.
RUNNER_REASONS = frozenset(
    {
        "provider-auth-refused",
        "cost-cap",
        "model-not-allowed",
        "cost-cap-unenforceable",
        "model-policy-unenforceable",
        "turn-budget",
        "token-budget",
        "command-unregistered",
        "runner-config",
    }
)


@dataclass(frozen=True)
class Telemetry:
    turns: int | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_total: int | None = None
    cost: Decimal | None = None
    usage: dict | None = None
    reason: str | None = None


NO_TELEMETRY = Telemetry()


def _count(value, limit=MAX_COUNT) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= limit:
        return value
    return None


def _cost(value) -> Decimal | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        cost = Decimal(str(value))
    except InvalidOperation:
        return None
    if not cost.is_finite() or cost < 0 or cost > MAX_COST:
        return None
    return cost.quantize(Decimal("0.000001"))


def _usage(raw) -> dict | None:
    """The per-model ledger; any violation drops the whole block (a half-trusted ledger is worse)."""
    if not isinstance(raw, dict):
        return None
    models = raw.get("models")
    if not isinstance(models, list) or not 1 <= len(models) <= MAX_MODEL_ROWS:
        return None
    rows = []
    for model in models:
        if not isinstance(model, dict):
            return None
        provider, name = model.get("provider"), model.get("model")
        if not (isinstance(provider, str) and MODEL_ID.fullmatch(provider.lower())):
            return None
        if not (isinstance(name, str) and MODEL_ID.fullmatch(name.lower())):
            return None
        row = {"provider": provider.lower(), "model": name.lower()}
        for key in USAGE_NUMBERS:
            if key in model:
                number = _count(model[key])
                if number is None:
                    return None
                row[key] = number
        if "cost" in model:
            cost = _cost(model["cost"])
            if cost is None:
                return None
            row["cost"] = str(cost)
        rows.append(row)
    return {"models": rows}


def _last_exit_line(output: bytes) -> bytes | None:
    tail = output[-MAX_LINE_BYTES * 2 :]
    start = tail.rfind(MARKER)
    if start < 0:
        return None
    line = tail[start:].split(b"\n", 1)[0].strip()
    return line if len(line) <= MAX_LINE_BYTES else None


def parse_exit_line(output: bytes, exit_code: int | None) -> Telemetry:
    line = _last_exit_line(output or b"")
    if line is None:
        return NO_TELEMETRY
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return NO_TELEMETRY
    if not isinstance(data, dict) or data.get("event") != "exit":
        return NO_TELEMETRY

    tokens = data.get("tokens") if isinstance(data.get("tokens"), dict) else {}
    reason = data.get("reason")
    return Telemetry(
        turns=_count(data.get("turns"), MAX_TURNS),
        tokens_in=_count(tokens.get("input")),
        tokens_out=_count(tokens.get("output")),
        tokens_total=_count(tokens.get("total")),
        cost=_cost(tokens.get("cost", data.get("cost"))),
        usage=_usage(data.get("usage")),
        reason=reason if exit_code == 2 and reason in RUNNER_REASONS else None,
    )


def parse_summary(output: bytes) -> str:
    """The agent's last message, from the runner's `{"event":"summary","text":...}` line: untrusted text for
    the forge (a pull request's body, a comment), never for a log or a record. Empty when there is none."""
    output = output or b""
    start = output.rfind(SUMMARY_MARKER)
    if start < 0:
        return ""
    line = output[start:].split(b"\n", 1)[0].strip()
    if len(line) > MAX_SUMMARY_LINE_BYTES:
        return ""
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return ""
    text = data.get("text") if isinstance(data, dict) else None
    return text[:SUMMARY_CHARS] if isinstance(text, str) else ""
