"""Relative ages with the exact UTC time on hover."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from console.templatetags.console import age, duration, relative

NOW = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "just now"),
        (4, "just now"),
        (42, "42 s ago"),
        (60, "1 min ago"),
        (3599, "59 min ago"),
        (7200, "2 h ago"),
        (86400 * 3 + 5, "3 d ago"),
        (-90, "in 1 min"),
    ],
)
def test_relative_says_the_largest_whole_unit(seconds, text):
    assert relative(seconds) == text


@time_machine.travel(NOW, tick=False)
def test_age_shows_relative_time_and_the_exact_utc_time_on_hover():
    assert age(NOW - timedelta(minutes=5, seconds=30)) == (
        '<time datetime="2026-06-01T11:54:30Z" title="2026-06-01 11:54:30 UTC">5 min ago</time>'
    )
    assert "2 h ago" in age("2026-06-01T10:00:00+00:00")
    assert "UTC" in age("2026-06-01T14:00:00+02:00")
    assert age(None) == "—"


def test_duration():
    assert duration(timedelta(minutes=15)) == "15 min"
    assert duration(None) == "a while"
