"""The cost page's pictures as server-rendered SVG (no script, no CDN: it works offline and prints).

Daily spend is drawn as columns on the left scale, the window's running total as a line on its own right
scale. A day holding any estimated run is drawn dashed and translucent (and says so in its tooltip), and the
running total turns dashed from the first such day: from there on it is no longer exact.
"""

from __future__ import annotations

from decimal import ROUND_CEILING, Decimal

from django.utils.html import conditional_escape, escape
from django.utils.safestring import SafeString, mark_safe

from .format import dollars

WIDTH, HEIGHT = 960, 300
LEFT, RIGHT, TOP, BOTTOM = 64, 72, 18, 46


def format_html(template: str, *args) -> SafeString:
    """Django's format_html, but numbers keep their format specs ({:.1f}); every other value is escaped."""
    return mark_safe(template.format(*(a if isinstance(a, (int, float)) and not isinstance(a, bool)
                                       else conditional_escape(a) for a in args)))


def _scale(value: Decimal) -> tuple[Decimal, Decimal]:
    """A round axis for the value: (top, step), at most five steps of 1, 2, 2.5 or 5 times a power of ten."""
    if value <= 0:
        return Decimal(1), Decimal("0.25")
    magnitude = Decimal(10) ** (value.adjusted() - 1)
    for factor in (1, 2, Decimal("2.5"), 5, 10, 20, 25, 50, 100):
        step = magnitude * factor
        if value <= step * 5:
            steps = (value / step).to_integral_value(rounding=ROUND_CEILING)
            return step * steps, step
    return value, value / 4


def daily_spend(days, window_label: str) -> SafeString:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    count = max(1, len(days))
    slot = plot_w / count
    column_w = max(2.0, slot * 0.7)
    top, step = _scale(max((day.spend for day in days), default=Decimal(0)))
    total = sum((day.spend for day in days), Decimal(0))
    cumulative_top, cumulative_step = _scale(total)
    estimated_days = sum(1 for day in days if day.estimated)
    base_y = TOP + plot_h

    parts = [format_html(
        '<svg xmlns="http://www.w3.org/2000/svg" id="cost-daily" viewBox="0 0 {} {}" width="100%" role="img" '
        'aria-label="Daily spend over {}, with the running total" data-days="{}" data-estimated-days="{}" '
        'data-total="{}">', WIDTH, HEIGHT, window_label, len(days), estimated_days, total)]
    parts.append(format_html('<title>Daily spend over {}: {} in all</title>', window_label,
                             dollars(total, estimated=bool(estimated_days))))
    # Grid and the two scales: dollars per day on the left (with the grid), the running total on the right.
    tick = Decimal(0)
    while tick <= top:
        y = base_y - float(tick / top) * plot_h
        parts.append(format_html('<line class="grid" x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}"/>', LEFT, y,
                                 LEFT + plot_w, y))
        parts.append(format_html('<text class="axis" x="{}" y="{:.1f}" text-anchor="end">{}</text>', LEFT - 6, y + 4,
                                 dollars(tick, compact=True, step=step)))
        tick += step
    tick = Decimal(0)
    while tick <= cumulative_top:
        y = base_y - float(tick / cumulative_top) * plot_h
        parts.append(format_html('<text class="axis cumulative-axis" x="{}" y="{:.1f}">{}</text>', LEFT + plot_w + 6,
                                 y + 4, dollars(tick, compact=True, step=cumulative_step)))
        tick += cumulative_step
    label_every = max(1, round(count / 10))
    running = Decimal(0)
    solid, dashed = [], []
    first_estimated = None
    for index, day in enumerate(days):
        x = LEFT + index * slot + (slot - column_w) / 2
        centre = LEFT + index * slot + slot / 2
        height = float(day.spend / top) * plot_h if top else 0
        tip = f"{day.day:%a %Y-%m-%d}: {dollars(day.spend, estimated=bool(day.estimated))}, {day.runs} run" \
              f"{'' if day.runs == 1 else 's'}" + (f", {day.estimated} estimated" if day.estimated else "")
        classes = "day-col estimated" if day.estimated else "day-col"
        if day.spend > 0:
            parts.append(format_html(
                '<rect class="{}" x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" data-day="{}" data-spend="{}">'
                '<title>{}</title></rect>', classes, x, base_y - height, column_w, max(height, 1.0), day.day,
                day.spend, tip))
        else:  # a quiet day is a tick on the baseline, not a gap that reads as missing data
            parts.append(format_html(
                '<rect class="day-col quiet" x="{:.1f}" y="{:.1f}" width="{:.1f}" height="2" data-day="{}" '
                'data-spend="0"><title>{}</title></rect>', x, base_y - 1, column_w, day.day, tip))
        if index % label_every == 0:
            parts.append(format_html('<text class="axis day-label" x="{:.1f}" y="{}" text-anchor="middle">{}</text>',
                                     centre, base_y + 16, f"{day.day:%b %d}"))
        running += day.spend
        point = f"{centre:.1f},{base_y - float(running / cumulative_top) * plot_h:.1f}"
        if day.estimated and first_estimated is None:
            first_estimated = index
            if solid:
                dashed.append(solid[-1])  # the dashed stretch starts where the exact one ends
        (dashed if first_estimated is not None else solid).append(point)
    if len(solid) > 1:
        parts.append(format_html('<polyline class="cumulative" points="{}"/>', " ".join(solid)))
    if len(dashed) > 1:
        parts.append(format_html('<polyline class="cumulative estimated" points="{}"/>', " ".join(dashed)))
    parts.append(format_html('<line class="baseline" x1="{}" y1="{}" x2="{}" y2="{}"/>', LEFT, base_y,
                             LEFT + plot_w, base_y))
    legend_y = HEIGHT - 8
    parts.append(format_html(
        '<g class="legend"><rect class="day-col" x="{}" y="{}" width="12" height="10"/>'
        '<text x="{}" y="{}">spend per UTC day (left)</text>'
        '<rect class="day-col estimated" x="{}" y="{}" width="12" height="10"/>'
        '<text x="{}" y="{}">a day with estimated runs</text>'
        '<line class="cumulative" x1="{}" y1="{}" x2="{}" y2="{}"/><text x="{}" y="{}">running total (right)</text>'
        '</g>', LEFT, legend_y - 9, LEFT + 16, legend_y, LEFT + 200, legend_y - 9, LEFT + 216, legend_y,
        LEFT + 420, legend_y - 4, LEFT + 444, legend_y - 4, LEFT + 450, legend_y))
    parts.append(mark_safe("</svg>"))
    return mark_safe("".join(parts))


def bar(value, largest, *, estimated: bool = False, width: int = 110) -> SafeString:
    """One breakdown row's share of its largest row."""
    share = float(value / largest) if largest else 0.0
    filled = max(1.0, share * width) if value else 0.0
    return format_html('<svg class="bar" width="{}" height="12" viewBox="0 0 {} 12" aria-hidden="true">'
                       '<rect class="bar-bg" width="{}" height="12"/><rect class="bar-fill{}" width="{:.1f}" '
                       'height="12"/></svg>', width, width, width, " estimated" if estimated else "", filled)


def meter(percent: int, state: str, width: int = 200) -> SafeString:
    return format_html('<svg class="meter" width="{}" height="12" viewBox="0 0 {} 12" aria-hidden="true">'
                       '<rect class="bar-bg" width="{}" height="12"/><rect class="meter-fill {}" width="{:.1f}" '
                       'height="12"/></svg>', width, width, width, escape(state.replace(" ", "-")),
                       width * min(percent, 100) / 100)
