"""Dollar prices per model: pi's own list prices (pi_registry.json, pinned with pi), under the operator's.

`PI_MODEL_PRICES` names a JSON file of the operator's prices, which win over pi's:

    {"acme/coder-1": {"input": 3, "output": 15, "cacheRead": 0.3, "cacheWrite": 3.75}}

in dollars per million tokens, keyed `provider/model`, with an optional `"date": "YYYY-MM-DD"` saying when the
operator took them. A model priced nowhere has no cost (None), never 0. Each priced row of a run's usage ledger
names the date of the table that priced it (`priceDate`: the operator's, or pi's list as of its registry).
"""

from __future__ import annotations

import json
from decimal import Decimal
from functools import cache
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from apps.worker.sandbox.providers import builtin_providers, registry

PRICE_FIELDS = ("input", "output", "cacheRead", "cacheWrite")
MILLION = Decimal(1_000_000)


@cache
def _operator_prices(path: str) -> dict[str, dict[str, Decimal]]:
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ImproperlyConfigured(
            f"PI_MODEL_PRICES: {path} is not a readable JSON file ({type(exc).__name__})") from exc
    return parse_operator_prices(raw)


def parse_operator_prices(raw) -> dict[str, dict[str, Decimal]]:
    if not isinstance(raw, dict):
        raise ImproperlyConfigured('PI_MODEL_PRICES: expected {"provider/model": {"input": ..., "output": ...}}')
    table = {}
    for key, entry in raw.items():
        if key == "date":
            if not isinstance(entry, str) or not _is_date(entry):
                raise ImproperlyConfigured("PI_MODEL_PRICES: date must be YYYY-MM-DD (when these prices were taken)")
            continue
        if not isinstance(key, str) or "/" not in key or not isinstance(entry, dict):
            raise ImproperlyConfigured(f"PI_MODEL_PRICES: {key!r} must be provider/model with an object of prices")
        row = {}
        for name in PRICE_FIELDS:
            value = entry.get(name, 0)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ImproperlyConfigured(f"PI_MODEL_PRICES: {key}.{name} must be a number of dollars >= 0")
            row[name] = Decimal(str(value))
        table[key.lower()] = row
    return table


def _is_date(text: str) -> bool:
    from datetime import date

    try:
        date.fromisoformat(text)
    except ValueError:
        return False
    return len(text) == 10


@cache
def _operator_date(path: str) -> str:
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return ""
    return raw.get("date", "") if isinstance(raw, dict) and isinstance(raw.get("date"), str) else ""


def price_date(provider: str, model: str) -> str:
    """The date of the price table that prices this model ("" when none does, or the operator gave none)."""
    if settings.PI_MODEL_PRICES and f"{provider}/{model}".lower() in _operator_prices(settings.PI_MODEL_PRICES):
        return _operator_date(settings.PI_MODEL_PRICES)
    return str(registry().get("generated", "")) if price(provider, model) is not None else ""


def operator_table() -> dict[str, dict[str, Decimal]]:
    """The operator's prices, keyed `provider/model` in lowercase ({} when PI_MODEL_PRICES is unset)."""
    return _operator_prices(settings.PI_MODEL_PRICES) if settings.PI_MODEL_PRICES else {}


def price(provider: str, model: str) -> dict[str, Decimal] | None:
    operator = operator_table().get(f"{provider}/{model}".lower())
    if operator is not None:
        return operator
    builtin = (builtin_providers().get(provider) or {}).get("prices", {})
    entry = builtin.get(model) or next((value for key, value in builtin.items() if key.lower() == model.lower()), None)
    if entry is None:
        return None
    return {name: Decimal(str(entry.get(name, 0))) for name in PRICE_FIELDS}


def cost(provider: str, model: str, usage) -> Decimal | None:
    rates = price(provider, model)
    if rates is None:
        return None
    return (rates["input"] * usage.input + rates["output"] * usage.output + rates["cacheRead"] * usage.cache_read
            + rates["cacheWrite"] * usage.cache_write) / MILLION


def is_listed(provider: str, model: str) -> bool:
    """A model pi's registry or the operator's prices name (what the gateway lets into a record)."""
    return price(provider, model) is not None
