"""PlainSelect writes the <select> Django's Select would, without the form renderer."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from django import forms

from console.forms import PlainSelect, QueueFilterForm

CHOICES = [("", "Any state"), ("unknown", "Unknown"), ("reconcile", "Reconcile <b>")]


class Plain(forms.Form):
    state = forms.ChoiceField(required=False, choices=CHOICES, widget=PlainSelect)


class Stock(forms.Form):
    state = forms.ChoiceField(required=False, choices=CHOICES)


class _Parsed(HTMLParser):
    """Tags with their attributes (in any order) and text: what a browser reads."""

    def __init__(self) -> None:
        super().__init__()
        self.read: list[object] = []

    def handle_starttag(self, tag, attrs):
        self.read.append((tag, sorted(attrs, key=lambda pair: pair[0])))

    def handle_endtag(self, tag):
        self.read.append(f"/{tag}")

    def handle_data(self, data):
        if data.strip():
            self.read.append(data)


def _tight(html: object) -> list[object]:
    parsed = _Parsed()
    parsed.feed(str(html))
    return parsed.read


@pytest.mark.parametrize("data", [{}, {"state": ""}, {"state": "reconcile"}, {"state": "bogus"}])
def test_plain_select_writes_what_djangos_select_writes(data):
    plain, stock = Plain(data), Stock(data)
    plain.is_valid(), stock.is_valid()  # an invalid value is marked (aria-invalid) by both
    assert _tight(plain["state"]) == _tight(stock["state"])


def test_the_queue_filters_keep_what_was_chosen():
    form = QueueFilterForm({"state": "reconcile", "provider": "b"}, providers=["a", "b"])
    assert form.is_valid()
    assert '<option value="reconcile" selected>Reconcile</option>' in str(form["state"])
    assert '<option value="b" selected>b</option>' in str(form["provider"])
    assert '<option value="" selected>Any verdict</option>' in str(form["verdict"])
