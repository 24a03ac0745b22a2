"""The server-drawn SVG charts: readable without colour, named for screen readers, escaped."""

from __future__ import annotations

import re

from console.charts import Bar, Series, bar_chart, legend

SERIES = (Series("a", "alpha", "solid", "var(--ok)"), Series("b", "beta", "hatch", "var(--bad)"))


def _chart(**kwargs):
    defaults = {
        "chart_id": "c",
        "title": "Title",
        "description": "What it shows",
        "bars": [Bar("one", {"a": 3, "b": 1}), Bar("two", {"a": 0, "b": 2})],
        "series": SERIES,
    }
    return str(bar_chart(**{**defaults, **kwargs}))


def test_a_chart_is_an_image_with_a_title_and_description():
    svg = _chart()
    assert svg.startswith('<svg class="chart" id="c" role="img" aria-labelledby="c-title c-desc"')
    assert '<title id="c-title">Title</title><desc id="c-desc">What it shows</desc>' in svg


def test_each_bar_carries_its_label_and_total_as_text():
    svg = _chart()
    labels = re.findall(r'<text class="chart-label"[^>]*>([^<]*)</text>', svg)
    totals = re.findall(r'<text class="chart-value"[^>]*>([^<]*)</text>', svg)
    assert labels == ["one", "two"]
    assert totals == ["4", "2"]


def test_each_series_has_a_pattern_of_its_own_not_only_a_colour():
    svg = _chart()
    patterns = re.findall(r'<pattern id="(c-[ab])"[^>]*style="color: ([^"]*)">(.*?)</pattern>', svg)
    assert [(pid, colour) for pid, colour, _ in patterns] == [
        ("c-a", "var(--ok)"),
        ("c-b", "var(--bad)"),
    ]
    assert patterns[0][2] != patterns[1][2]  # solid and hatched
    # Each part of a bar is filled with its series' pattern and says what it is on hover.
    assert (
        '<rect x="0.00%" y="21" width="66.00%" height="20" fill="url(#c-a)">'
        "<title>one: 3 alpha</title>" in svg
    )
    assert "two: 0 alpha" not in svg  # an empty part is not drawn
    key = str(legend(chart_id="c", series=SERIES))
    assert key.count("<li>") == 2 and 'fill="url(#c-b)"' in key and "beta" in key


def test_bars_are_scaled_to_the_longest_and_links_go_on_the_total():
    svg = _chart(bars=[Bar("x", {"a": 5}, href="/?a=1&b=2"), Bar("y", {"a": 10})], label_width=20)
    widths = re.findall(r'<rect x="[\d.]+%" y="\d+" width="([\d.]+)%"', svg)
    assert [float(w) for w in widths] == [34.0, 68.0]
    assert '<a href="/?a=1&amp;b=2"><text class="chart-value"' in svg


def test_text_is_escaped():
    svg = _chart(title="<script>", bars=[Bar("<b>", {"a": 1})])
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    assert "<b>" not in svg


def test_no_bars_still_draws_an_empty_chart():
    svg = _chart(bars=[])
    assert 'height="26"' in svg
