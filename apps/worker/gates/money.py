"""Dollar amounts as integer micro-dollars: what the dollar caps reserve and settle in Redis.

Every dollar setting (PI_MAX_COST_USD and the windows, the settings row's fields, a scoped limit's dollar
fields, a trigger's `run.maxCostUsd`) is a decimal string or number of dollars, more than 0, at most
1,000,000, with at most 6 decimals (a micro-dollar): the ancestor's rule. Integers in Redis keep a race of
holds and settlements exact; a float would drift by fractions of a cent.
"""

from __future__ import annotations

import math
import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation

MICROS = 1_000_000
MAX_USD = Decimal(1_000_000)
PLAIN_DECIMAL = re.compile(r"^[0-9]+(\.[0-9]{1,6})?$")


class MoneyError(ValueError):
    """The message names the rule; the caller adds the setting's name."""


def parse_usd(value) -> int | None:
    """Micro-dollars of a dollar amount (None for unset: None or ""). Raises MoneyError for anything else."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise MoneyError("must be a number of dollars, not true/false")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise MoneyError("must be a finite number of dollars")
        value = repr(value)
    if isinstance(value, Decimal):
        amount = value
    else:
        text = str(value).strip()
        if text.startswith("-") and PLAIN_DECIMAL.fullmatch(text[1:]):
            raise MoneyError("is negative: a cap is a number of dollars more than 0 (leave it unset for no cap)")
        if not PLAIN_DECIMAL.fullmatch(text):
            raise MoneyError("must be a plain number of dollars with at most 6 decimals, like 2.50")
        amount = Decimal(text)
    try:
        micros = amount * MICROS
    except InvalidOperation:
        raise MoneyError("must be a number of dollars") from None
    if micros != micros.to_integral_value():
        raise MoneyError("has more than 6 decimals (a micro-dollar is the smallest amount)")
    if amount < 0:
        raise MoneyError("is negative: a cap is a number of dollars more than 0 (leave it unset for no cap)")
    if amount == 0:
        raise MoneyError("must be more than 0 (leave it unset for no cap)")
    if amount > MAX_USD:
        raise MoneyError("must be at most 1000000 dollars")
    return int(micros)


def to_usd(micros: int | None) -> Decimal | None:
    return None if micros is None else (Decimal(micros) / MICROS).quantize(Decimal("0.000001"))


def cost_micros(cost: Decimal) -> int:
    """A metered cost in micro-dollars, rounded up: a window is never charged less than was spent."""
    return int((cost * MICROS).to_integral_value(rounding=ROUND_CEILING))
