"""Numbers as an operator reads them: dollars to the cent (sub-dollar amounts to four places, where a run's
cost lives), counts with thousands separators, shares as percentages."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal


def dollars(value, *, estimated: bool = False, compact: bool = False) -> str:
    """`$12.34`; `$0.0252` below a dollar; `~$12.34 est.` when any run behind it was estimated."""
    if value is None:
        return "—"
    amount = Decimal(value)
    if compact:  # axis labels
        text = f"${amount:,.0f}" if amount >= 10 else f"${amount:.2f}".replace(".00", "") if amount >= 1 or amount == 0 \
            else f"${amount.normalize():f}"
    elif amount == 0:
        text = "$0.00"
    elif abs(amount) < 1:
        text = f"${amount.quantize(Decimal('0.0001'), ROUND_HALF_UP)}"
    else:
        text = f"${amount.quantize(Decimal('0.01'), ROUND_HALF_UP):,}"
    return f"~{text} est." if estimated else text


def count(value) -> str:
    return "—" if value is None else f"{int(value):,}"


def share(value) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"
