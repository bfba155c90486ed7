"""What a job spends, read from its provider's own responses as they pass through the gateway.

Each API reports usage in its own shape, streamed or not; the numbers are normalised the way pi itself does
(pi-ai's providers), so a run's record and pi's own count agree:

    input       prompt tokens neither read from nor written to a prompt cache
    cacheRead   prompt tokens read from the cache
    cacheWrite  prompt tokens written to the cache
    output      completion tokens (reasoning included)

    openai-completions    `usage` of the last chunk (stream_options.include_usage) or of the body
    openai-responses      `response.usage` of `response.completed` (or the body's `usage`)
    anthropic-messages    `message_start`'s `message.usage`, then each `message_delta`'s `usage` (cumulative)
    google-generative-ai  the last `usageMetadata`

A job's ledger is one row per model; cost comes from prices.py. Nothing here keeps a body: a reader sees one
event at a time and keeps only numbers.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal

from apps.worker.sandbox import prices
from apps.worker.sandbox.exitline import Telemetry

MAX_EVENT_BYTES = 4 * 1024 * 1024  # one SSE line or JSON body larger than this is not metered (it is forwarded)
MAX_MODEL_ROWS = 8
MODEL_ID = re.compile(r"^[a-z0-9][a-z0-9._:/-]{0,63}$")


@dataclass
class Usage:
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0

    @property
    def total(self) -> int:
        return self.input + self.output + self.cache_read + self.cache_write


def _count(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**12 else 0


def _openai_completions(usage: dict) -> Usage:
    prompt = _count(usage.get("prompt_tokens"))
    details = usage.get("prompt_tokens_details") if isinstance(usage.get("prompt_tokens_details"), dict) else {}
    cached = _count(details.get("cached_tokens")) or _count(usage.get("prompt_cache_hit_tokens"))
    written = _count(details.get("cache_write_tokens"))
    cache_read = max(0, cached - written) if written else cached
    return Usage(input=max(0, prompt - cache_read - written), output=_count(usage.get("completion_tokens")),
                 cache_read=cache_read, cache_write=written)


def _openai_responses(usage: dict) -> Usage:
    details = usage.get("input_tokens_details") if isinstance(usage.get("input_tokens_details"), dict) else {}
    cached = _count(details.get("cached_tokens"))
    return Usage(input=max(0, _count(usage.get("input_tokens")) - cached), output=_count(usage.get("output_tokens")),
                 cache_read=cached)


def _anthropic(usage: dict, into: Usage) -> Usage:
    """Fields present in this event replace the running ones (message_delta's counts are cumulative)."""
    for key, attribute in (("input_tokens", "input"), ("output_tokens", "output"),
                           ("cache_read_input_tokens", "cache_read"), ("cache_creation_input_tokens", "cache_write")):
        if usage.get(key) is not None:
            setattr(into, attribute, _count(usage.get(key)))
    return into


def _google(usage: dict) -> Usage:
    cached = _count(usage.get("cachedContentTokenCount"))
    return Usage(input=max(0, _count(usage.get("promptTokenCount")) - cached),
                 output=_count(usage.get("candidatesTokenCount")) + _count(usage.get("thoughtsTokenCount")),
                 cache_read=cached)


def _mapping(value) -> dict:
    return value if isinstance(value, dict) else {}


def read_usage(api: str, document: dict, current: Usage | None) -> Usage | None:
    """The usage after this document (one stream event, or a whole response body), given the usage so far."""
    if api == "openai-completions":
        usage = document.get("usage") or _mapping((document.get("choices") or [{}])[0]).get("usage")
        return _openai_completions(usage) if isinstance(usage, dict) else current
    if api == "openai-responses":
        kind = document.get("type")
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            usage = _mapping(document.get("response")).get("usage")
        elif document.get("object") == "response":
            usage = document.get("usage")
        else:
            return current
        return _openai_responses(usage) if isinstance(usage, dict) else current
    if api == "anthropic-messages":
        kind = document.get("type")
        if kind == "message_start":
            return _anthropic(_mapping(_mapping(document.get("message")).get("usage")), Usage())
        if kind == "message_delta" and isinstance(document.get("usage"), dict):
            return _anthropic(document["usage"], current or Usage())
        if kind == "message" and isinstance(document.get("usage"), dict):
            return _anthropic(document["usage"], Usage())
        return current
    if api == "google-generative-ai":
        usage = document.get("usageMetadata")
        return _google(usage) if isinstance(usage, dict) else current
    return current


class ResponseReader:
    """Reads one provider response as it streams past: SSE `data:` lines, or one JSON body."""

    def __init__(self, api: str, streaming: bool):
        self.api = api
        self.streaming = streaming
        self.usage: Usage | None = None
        self._buffer = bytearray()
        self._overflowed = False

    def feed(self, chunk: bytes) -> None:
        if self._overflowed:
            if self.streaming and b"\n" in chunk:  # a long line ended: the next ones are read again
                self._overflowed = False
                self._buffer = bytearray(chunk.rsplit(b"\n", 1)[1])
            return
        self._buffer += chunk
        if self.streaming:
            *lines, rest = self._buffer.split(b"\n")
            self._buffer = bytearray(rest)
            for line in lines:
                self._line(bytes(line))
        if len(self._buffer) > MAX_EVENT_BYTES:
            self._overflowed = True
            self._buffer = bytearray()

    def _line(self, line: bytes) -> None:
        line = line.rstrip(b"\r")
        if not line.startswith(b"data:"):
            return
        data = line[5:].strip()
        if data and data != b"[DONE]":
            self._document(data)

    def _document(self, data: bytes) -> None:
        try:
            document = json.loads(data)
        except ValueError:
            return
        if isinstance(document, dict):
            self.usage = read_usage(self.api, document, self.usage)
        elif isinstance(document, list):  # Google's non-streamed streamGenerateContent answers with an array
            for item in document:
                if isinstance(item, dict):
                    self.usage = read_usage(self.api, item, self.usage)

    def finish(self) -> Usage | None:
        if not self._overflowed and self._buffer:
            if self.streaming:
                self._line(bytes(self._buffer))
            else:
                self._document(bytes(self._buffer))
        self._buffer = bytearray()
        return self.usage


@dataclass
class ModelRow:
    provider: str
    model: str
    calls: int = 0
    usage: Usage = field(default_factory=Usage)
    priced: bool = True
    cost: Decimal = Decimal(0)

    def as_dict(self) -> dict:
        row = {"provider": self.provider, "model": self.model, "calls": self.calls, "input": self.usage.input,
               "output": self.usage.output, "cacheRead": self.usage.cache_read,
               "cacheWrite": self.usage.cache_write, "total": self.usage.total}
        if self.priced:
            row["cost"] = str(self.cost.quantize(Decimal("0.000001")))
            if self.provider != "other" and (date := prices.price_date(self.provider, self.model)):
                row["priceDate"] = date
        return row


@dataclass(frozen=True)
class ModelSpend:
    """One model's share of a job: what a per-model ledger (a `model:<provider>/<model>` row) is charged."""

    calls: int
    tokens: int
    cost_micros: int | None  # None: a call of it could not be priced (no price known)

    def as_dict(self) -> dict:
        return {"calls": self.calls, "tokens": self.tokens, "costMicros": self.cost_micros}


class Meter:
    """One job's ledger, kept by its gateway. Safe to read from the worker's thread once the gateway stopped."""

    def __init__(self):
        self.rows: dict[tuple[str, str], ModelRow] = {}
        self.calls = 0
        self.worst_cases = 0  # answers charged their reserved worst case (cut short, or no usage reported)

    @property
    def metered(self) -> bool:
        return self.calls > 0

    @property
    def priced_cost(self) -> Decimal:
        """What the priced calls cost so far (unrounded): the dollar cap's running count."""
        return sum((row.cost for row in self.rows.values()), Decimal(0))

    def known_cost(self) -> Decimal | None:
        """The whole cost, when every call was priced (an answer cut short counts its worst case); None when it
        cannot be known."""
        if not self.metered or not all(row.priced for row in self.rows.values()):
            return None
        return self.priced_cost

    @property
    def tokens_total(self) -> int:
        return sum(row.usage.total for row in self.rows.values())

    def record(self, provider: str, model: str, usage: Usage | None, *, worst_case: Decimal | None = None) -> int:
        """One answered provider call; returns the tokens it used (0 when the answer carried no usage).
        `worst_case`: the call is charged this reserved cost instead of its usage at list price."""
        self.calls += 1
        model = model if MODEL_ID.fullmatch(model) else "unlisted"
        row = self.rows.setdefault((provider, model), ModelRow(provider, model))
        row.calls += 1
        if usage is None:
            return 0
        for attribute in ("input", "output", "cache_read", "cache_write"):
            setattr(row.usage, attribute, getattr(row.usage, attribute) + getattr(usage, attribute))
        if worst_case is not None:
            self.worst_cases += 1
        cost = worst_case if worst_case is not None else prices.cost(provider, model, usage)
        if cost is None:
            row.priced = False
        else:
            row.cost += cost
        return usage.total

    def spend_by_model(self) -> dict[str, ModelSpend]:
        """`provider/model` (lowercase) -> its spend; the micro-dollars are rounded up, so per-model charges never
        add up to less than the job's own."""
        spend = {}
        for row in self.rows.values():
            cost = int((row.cost * 1_000_000).to_integral_value(rounding=ROUND_CEILING)) if row.priced else None
            spend[f"{row.provider}/{row.model}".lower()] = ModelSpend(row.calls, row.usage.total, cost)
        return spend

    def telemetry(self, turns: int | None) -> Telemetry:
        rows = sorted(self.rows.values(), key=lambda row: row.usage.total, reverse=True)
        if len(rows) > MAX_MODEL_ROWS:
            rest = rows[MAX_MODEL_ROWS - 1:]
            other = ModelRow("other", "other", calls=sum(row.calls for row in rest),
                             priced=all(row.priced for row in rest), cost=sum((row.cost for row in rest), Decimal(0)))
            for row in rest:
                for attribute in ("input", "output", "cache_read", "cache_write"):
                    setattr(other.usage, attribute, getattr(other.usage, attribute) + getattr(row.usage, attribute))
            rows = rows[:MAX_MODEL_ROWS - 1] + [other]
        prompt = sum(row.usage.input + row.usage.cache_read + row.usage.cache_write for row in rows)
        output = sum(row.usage.output for row in rows)
        cost = (sum((row.cost for row in rows), Decimal(0)).quantize(Decimal("0.000001"))
                if all(row.priced for row in rows) else None)
        return Telemetry(turns=turns, tokens_in=prompt, tokens_out=output, tokens_total=prompt + output, cost=cost,
                         usage={"source": "gateway", "models": [row.as_dict() for row in rows]})
