"""The layout, health check, the operation page and JSON 404s under /api/."""

from __future__ import annotations

import io
import logging

import pytest
from django.test import Client

from harness.accounts import PASSWORD
from tests.support.console import console_user

pytestmark = pytest.mark.django_db


def _static(client: Client, path: str) -> bytes:
    response = client.get(path)
    assert response.status_code == 200, path
    return b"".join(response.streaming_content)


def test_the_layout_serves_its_stylesheet_htmx_and_script_and_sends_csrf_with_htmx(
    client, operator
):
    client.force_login(operator)
    page = client.get("/").content.decode()
    assert '<body hx-headers=\'{"X-CSRFToken": "' in page
    assert client.cookies["csrftoken"]  # the token in the header is a real one
    assert "prefers-color-scheme: dark" in _static(client, "/static/settle/settle.css").decode()
    assert b"htmx" in _static(client, "/static/vendor/htmx-2.0.11.min.js")
    assert b'event.key === "j"' in _static(client, "/static/settle/console.js")
    for url in ("/static/settle/settle.css", "/static/vendor/htmx-2.0.11.min.js"):
        assert url in page
    assert "Sign out" in page and "olivia" in page


def test_the_admin_link_is_shown_to_staff_only(client, operator):
    client.force_login(operator)
    assert "Administration" not in client.get("/").content.decode()
    operator.is_staff = True
    operator.save()
    assert "Administration" in client.get("/").content.decode()


def test_healthz_reports_the_database(client):
    assert client.get("/healthz").json()["ok"] is True
    assert client.post("/healthz").status_code == 405


def test_unknown_page_is_html_and_unknown_api_path_is_json(client):
    response = client.get("/nowhere")
    assert response.status_code == 404
    assert b"<h1>Not found</h1>" in response.content
    response = client.get("/api/v1/nowhere")
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"


# -- the operation page ---------------------------------------------------------------


def test_an_operator_sees_the_operation_record(client, operator, stuck):
    stuck.mismatch("op-1")
    client.force_login(operator)
    page = client.get("/operations/op-1/")
    assert page.status_code == 200
    html = page.content.decode()
    for text in ("Intended action", "Provider evidence", "Host receipt", "w-dead", "x-1"):
        assert text in html
    assert 'verdict-mismatch">mismatch<' in html
    assert "&quot;amount&quot;: 1250" in html


def test_a_viewer_sees_the_operation_too(client, viewer, stuck):
    stuck.unknown("op-1")
    client.force_login(viewer)
    assert client.get("/operations/op-1/").status_code == 200


def test_another_providers_operation_answers_404_like_a_missing_one(client, outsider, stuck):
    stuck.unknown("op-1")
    client.force_login(outsider)
    hidden = client.get("/operations/op-1/")
    missing = client.get("/operations/op-nothing/")
    assert hidden.status_code == missing.status_code == 404
    assert "op-1" not in hidden.content.decode()


def test_a_user_without_a_role_gets_404(client, stuck):
    stuck.unknown("op-1")
    client.force_login(console_user("nobody"))
    assert client.get("/operations/op-1/").status_code == 404


def test_the_operation_page_answers_405_to_a_post(client, operator, stuck):
    stuck.unknown("op-1")
    client.force_login(operator)
    assert client.post("/operations/op-1/").status_code == 405


def test_the_csrf_header_on_body_is_accepted_for_a_post(operator):
    """What htmx sends (hx-headers on <body>) passes Django's CSRF check."""
    import re

    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    page = client.get("/").content.decode()
    (token,) = re.findall(r'hx-headers=\'\{"X-CSRFToken": "([^"]+)"\}\'', page)
    assert client.post("/logout/", HTTP_X_CSRFTOKEN="not-the-token").status_code == 403
    assert client.post("/logout/", HTTP_X_CSRFTOKEN=token).status_code == 302


def test_a_refused_page_is_styled_says_why_and_logs_no_traceback(client, provider):
    """An operator opening the dashboard: the console's 403 page with the reason, and one
    warning line in the log, not a traceback."""
    [handler] = [h for h in logging.getLogger().handlers if h.get_name() == "console"]
    assert isinstance(handler, logging.StreamHandler)
    log = io.StringIO()
    previous = handler.setStream(log)
    try:
        client.force_login(console_user("oscar", "operator", provider))
        response = client.get("/dashboard/")
    finally:
        handler.setStream(previous)
    page = response.content.decode()
    assert response.status_code == 403
    assert "settle/settle.css" in page and "<h1>Not allowed</h1>" in page
    assert "The dashboard is for supervisors of a provider." in page
    assert "Forbidden (Permission denied): /dashboard/" in log.getvalue()
    assert "Traceback" not in log.getvalue()


def test_every_page_names_its_icon_and_favicon_ico_leads_to_it(client, operator):
    client.force_login(operator)
    assert 'rel="icon" href="/static/settle/favicon.svg"' in client.get("/").content.decode()
    response = client.get("/favicon.ico")
    assert response.status_code == 301
    assert response["Location"] == "/static/settle/favicon.svg"
    assert b"<svg" in _static(client, "/static/settle/favicon.svg")


def test_what_sign_in_says_shows_on_the_queue(client, provider):
    """allauth's "signed in as" note shows on the page sign-in leads to, the queue."""
    console_user("olivia", "operator", provider)
    response = client.post("/login/", {"login": "olivia", "password": PASSWORD, "next": "/"})
    assert response["Location"] == "/"
    page = client.get("/").content.decode()
    assert '<ul class="notices"><li class="notice success">' in page
    assert "Successfully signed in as olivia." in page
    # Said once: the next page does not repeat it.
    assert "Successfully signed in" not in client.get("/").content.decode()
