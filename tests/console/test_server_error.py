"""The server error page: styled like the rest, and needing nothing that may have broken.

No test here may use the database: a 500 is often the database's.
"""

from __future__ import annotations

import pytest
from django.db import connections
from django.template.loader import render_to_string


@pytest.mark.urls("tests.console.urls_failing")
def test_a_view_that_raises_gets_the_styled_500_page_with_debug_off(client, settings):
    settings.DEBUG = False
    client.raise_request_exception = False
    response = client.get("/fails/")
    assert response.status_code == 500
    assert response["Content-Type"] == "text/html; charset=utf-8"
    page = response.content.decode()
    assert "<title>Something went wrong · Settle</title>" in page
    assert '<link rel="stylesheet" href="/static/settle/settle.css">' in page
    assert '<header class="bar">' in page and "<h1>Something went wrong</h1>" in page
    assert '<a href="/">Back to the queue</a>' in page
    assert "a bug the console did not foresee" not in page  # nothing of the error shows


def test_the_500_page_renders_with_no_context_and_no_database():
    """As Django's own server_error renders it: no request, no context processors."""
    with pytest.raises(RuntimeError, match="Database access not allowed"):
        connections["default"].cursor()
    page = render_to_string("500.html")
    assert "<h1>Something went wrong</h1>" in page and 'class="brand" href="/"' in page


@pytest.mark.urls("tests.console.urls_failing")
def test_a_database_outage_answers_the_503_page_not_the_500(client, settings):
    settings.DEBUG = False
    client.raise_request_exception = False
    response = client.get("/database-gone/")
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    page = response.content.decode()
    assert "<h1>Try again in a moment</h1>" in page
    assert "server closed the connection" not in page


def test_the_503_page_renders_with_no_context_and_no_database():
    page = render_to_string("503.html")
    assert "<h1>Try again in a moment</h1>" in page and 'class="brand" href="/"' in page
