"""Bar charts drawn on the server as SVG: numbers in, markup out, no script.

Each bar is labelled with its name and its total; each series of a stacked bar has a
pattern of its own (solid, hatched, dotted, …) as well as a colour, and a legend names
them, so colour is never needed to read a chart. Colours are the console's CSS
variables, so the light and dark themes apply. The positions are percentages of the
chart's width, the text is in pixels: the bars stretch with the page, the labels keep
their size. Every chart is ``role="img"`` with a title and a description, and the page
shows its numbers in a table beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

# A tile of 8 by 8 px per pattern, drawn in the series' colour (``currentColor``).
_PATTERNS = {
    "solid": '<rect width="8" height="8" fill="currentColor"/>',
    "hatch": (
        '<rect width="8" height="8" fill="currentColor" fill-opacity="0.25"/>'
        '<path d="M-2 2l4-4M0 8l8-8M6 10l4-4" stroke="currentColor" stroke-width="2"/>'
    ),
    "cross": (
        '<rect width="8" height="8" fill="currentColor" fill-opacity="0.2"/>'
        '<path d="M0 0l8 8M8 0l-8 8" stroke="currentColor" stroke-width="1.5"/>'
    ),
    "dots": (
        '<rect width="8" height="8" fill="currentColor" fill-opacity="0.2"/>'
        '<circle cx="4" cy="4" r="2" fill="currentColor"/>'
    ),
    "lines": (
        '<rect width="8" height="8" fill="currentColor" fill-opacity="0.2"/>'
        '<path d="M0 2h8M0 6h8" stroke="currentColor" stroke-width="1.5"/>'
    ),
    "columns": (
        '<rect width="8" height="8" fill="currentColor" fill-opacity="0.2"/>'
        '<path d="M2 0v8M6 0v8" stroke="currentColor" stroke-width="1.5"/>'
    ),
    "checks": (
        '<rect width="8" height="8" fill="currentColor" fill-opacity="0.2"/>'
        '<rect width="4" height="4" fill="currentColor"/>'
        '<rect x="4" y="4" width="4" height="4" fill="currentColor"/>'
    ),
}


@dataclass(frozen=True)
class Series:
    """One part of a stacked bar: its key in the data, its words, its look."""

    key: str
    label: str
    pattern: str = "solid"
    colour: str = "var(--accent)"


@dataclass(frozen=True)
class Bar:
    label: str
    values: dict[str, int]
    href: str = ""

    @property
    def total(self) -> int:
        return sum(self.values.values())


ROW = 26  # px per bar
LABEL_ROW = 18  # px for a label drawn above its bar


def bar_chart(
    *,
    chart_id: str,
    title: str,
    description: str,
    bars: Sequence[Bar],
    series: Sequence[Series],
    label_width: int = 0,
) -> SafeString:
    """Horizontal bars, one per ``bars``, stacked by ``series``, each with its total.

    ``label_width``: the share of the width (percent) the labels take, left of the bars;
    0 puts each label above its bar, for labels too long to sit beside it at any width.
    """
    top = max((bar.total for bar in bars), default=0) or 1
    left = label_width
    span = 100 - left - 12  # room on the right for the total
    rows = []
    y = 0
    for bar in bars:
        if not label_width:
            rows.append(
                format_html('<text class="chart-label" x="0" y="{}">{}</text>', y + 13, bar.label)
            )
            y += LABEL_ROW
        else:
            rows.append(
                format_html(
                    '<text class="chart-label" x="{}%" dx="-6" y="{}" text-anchor="end">{}</text>',
                    left,
                    y + 17,
                    bar.label,
                )
            )
        x = float(left)
        segments = []
        for one in series:
            value = bar.values.get(one.key, 0)
            if not value:
                continue
            width = span * value / top
            segments.append(
                format_html(
                    '<rect x="{}%" y="{}" width="{}%" height="{}" fill="url(#{}-{})">'
                    "<title>{}: {} {}</title></rect>",
                    _pct(x),
                    y + 3,
                    _pct(width),
                    ROW - 6,
                    chart_id,
                    one.key,
                    bar.label,
                    value,
                    one.label,
                )
            )
            x += width
        rows.append(mark_safe("".join(segments)))
        # The baseline, so that an empty bar still reads as a zero, not as missing.
        rows.append(
            format_html(
                '<line x1="{}%" x2="{}%" y1="{}" y2="{}" class="chart-axis"/>',
                left,
                left,
                y + 1,
                y + ROW - 1,
            )
        )
        total = format_html(
            '<text class="chart-value" x="{}%" dx="6" y="{}">{}</text>', _pct(x), y + 17, bar.total
        )
        if bar.href:
            total = format_html('<a href="{}">{}</a>', bar.href, total)
        rows.append(total)
        y += ROW
    # One pattern per series, coloured on the pattern itself: a pattern's content takes
    # its colour from where it is defined, not from the shape it fills.
    defs = format_html_join(
        "",
        '<pattern id="{}-{}" width="8" height="8" patternUnits="userSpaceOnUse" '
        'style="color: {}">{}</pattern>',
        ((chart_id, one.key, one.colour, mark_safe(_PATTERNS[one.pattern])) for one in series),
    )
    return format_html(
        '<svg class="chart" id="{}" role="img" aria-labelledby="{}-title {}-desc" width="100%" '
        'height="{}" xmlns="http://www.w3.org/2000/svg">'
        '<title id="{}-title">{}</title><desc id="{}-desc">{}</desc><defs>{}</defs>{}</svg>',
        chart_id,
        chart_id,
        chart_id,
        max(y, ROW),
        chart_id,
        title,
        chart_id,
        description,
        defs,
        mark_safe("".join(rows)),
    )


def legend(*, chart_id: str, series: Sequence[Series]) -> SafeString:
    """The key to a chart's patterns: a swatch of each beside its name."""
    items = format_html_join(
        "",
        '<li><svg width="16" height="12" aria-hidden="true"><rect width="16" height="12" '
        'fill="url(#{}-{})" stroke="currentColor" stroke-opacity="0.4"/></svg> {}</li>',
        ((chart_id, one.key, one.label) for one in series),
    )
    return format_html('<ul class="legend" aria-label="Key">{}</ul>', items)


def _pct(value: float) -> str:
    return f"{value:.2f}"
