"""Numbers as an operator reads them: dollars to the cent (sub-dollar amounts to four places, where a run's
cost lives), counts with thousands separators, shares as percentages."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal


def dollars(value, *, estimated: bool = False, compact: bool = False, step=None) -> str:
    """`$12.34`; `$0.0252` below a dollar; `~$12.34 est.` when any run behind it was estimated."""
    if value is None:
        return "—"
    amount = Decimal(value)
    if compact:  # axis labels: round ticks, as few digits as they need
        exponent = Decimal(step if step is not None else amount).normalize().as_tuple().exponent
        text = "$0" if not amount else f"${amount:,.0f}" if exponent >= 0 else \
            f"${amount:,.{max(2, -exponent)}f}"
    elif amount == 0:
        text = "$0.00"
    elif abs(amount) < 1:  # a run's cost lives here: keep four places where they say something
        places = f"{amount.quantize(Decimal('0.0001'), ROUND_HALF_UP):.4f}".rstrip("0")
        text = "$" + places + "0" * max(0, 2 - len(places.split(".")[1]))
    else:
        text = f"${amount.quantize(Decimal('0.01'), ROUND_HALF_UP):,}"
    return f"~{text} est." if estimated else text


def count(value) -> str:
    return "—" if value is None else f"{int(value):,}"


def share(value) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"
