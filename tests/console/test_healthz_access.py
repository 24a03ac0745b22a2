"""/healthz: the plain answer for anyone (the proxy), cheap; the detail for the bearer of
the metrics token or a staff session only, since it names the broker, the queues and the
open alarms."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

TOKEN = "metrics-token-for-the-healthz-tests"


@pytest.fixture
def no_broker(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every broker connection the request opens, recorded (and none really opened)."""
    from settle.celery import app

    opened: list[str] = []

    def connection_for_write(*args: Any, **kwargs: Any) -> Any:
        opened.append("write")
        raise OSError("no broker in this test")

    monkeypatch.setattr(app, "connection_for_write", connection_for_write)
    monkeypatch.setattr(app, "connection_for_read", connection_for_write)
    monkeypatch.setattr(app, "connection", connection_for_write)
    return opened


@pytest.fixture
def token(settings: Any) -> str:
    settings.SETTLE_METRICS_TOKEN = TOKEN
    return TOKEN


def test_the_plain_answer_opens_no_broker_connection(db: None, client: Client, no_broker):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"ok": True, "database": connection.vendor}
    assert no_broker == []


def test_anonymous_detail_reveals_nothing_of_the_broker_queues_or_alarms(
    db: None, client: Client, token: str, settings, no_broker
):
    for given in ({}, {"HTTP_AUTHORIZATION": "Bearer wrong-token-0123456789"}):
        response = client.get("/healthz?detail=1", **given)
        assert response.status_code == 401
        assert response["WWW-Authenticate"].startswith("Bearer")
        text = response.content.decode().lower()
        for word in (
            "broker",
            "queue",
            "alarm",
            "webhook",
            "checks",
            settings.SETTLE_WEBHOOK_QUEUE,
        ):
            assert word.lower() not in text, word
    assert no_broker == []


def test_a_signed_in_user_who_is_not_staff_gets_no_detail(db: None, token: str, no_broker):
    client = Client()
    client.force_login(User.objects.create_user("viewer"))
    assert client.get("/healthz?detail=1").status_code == 401
    assert no_broker == []


def test_the_detail_answers_the_metrics_token_and_a_staff_session(
    db: None, client: Client, token: str, no_broker
):
    response = client.get("/healthz?detail=1", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert "broker" in response.json()["checks"]
    staff = Client()
    staff.force_login(User.objects.create_user("admin", is_staff=True))
    assert "broker" in staff.get("/healthz?detail=1").json()["checks"]
    assert len(no_broker) == 2  # the detail, and only it, checks the broker


def test_without_a_token_configured_only_staff_get_the_detail(
    db: None, client: Client, settings, no_broker
):
    settings.SETTLE_METRICS_TOKEN = ""
    assert client.get("/healthz?detail=1", HTTP_AUTHORIZATION="Bearer ").status_code == 401
    assert no_broker == []
