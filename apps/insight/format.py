"""Numbers as an operator reads them: dollars to the cent (sub-dollar amounts to four places, where a run's
cost lives), counts with thousands separators, shares as percentages."""

from __future__ import annotations

from decimal import Decimal

from pidispatch_site import admin_display


def dollars(value, *, estimated: bool = False, compact: bool = False, step=None) -> str:
    """`$12.34`; `$0.0252` below a dollar (the admin's one format); `~$12.34 est.` when any run behind it was
    estimated; `compact` for axis labels."""
    if value is None:
        return "—"
    amount = Decimal(value)
    if compact:  # axis labels: round ticks, as few digits as they need
        exponent = Decimal(step if step is not None else amount).normalize().as_tuple().exponent
        text = "$0" if not amount else f"${amount:,.0f}" if exponent >= 0 else \
            f"${amount:,.{max(2, -exponent)}f}"
    else:
        text = admin_display.money(amount)
    return f"~{text} est." if estimated else text


def count(value) -> str:
    return admin_display.count(value)


def share(value) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"
