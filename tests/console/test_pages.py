"""The landing page, health check and JSON 404s under /api/."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

pytestmark = pytest.mark.django_db


def test_home_asks_an_anonymous_visitor_to_sign_in(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_home_lists_providers_and_serves_its_stylesheet(client, provider):
    client.force_login(User.objects.create_user("viewer", password="unused-pw"))
    page = client.get("/")
    assert page.status_code == 200
    assert b"orders" in page.content
    css = client.get("/static/settle/settle.css")
    assert css.status_code == 200
    assert b"--accent" in b"".join(css.streaming_content)


def test_healthz_reports_the_database(client):
    assert client.get("/healthz").json()["ok"] is True


def test_unknown_page_is_html_and_unknown_api_path_is_json(client):
    assert client.get("/nowhere").status_code == 404
    response = client.get("/api/v1/nowhere")
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"
