"""Every sign-in, sign-out and failure on the audit log's system chain, and the bound on
what one address can put there."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import time_machine
from django.test import Client

from audit.hashing import SYSTEM_CHAIN
from audit.kinds import AuditKind
from audit.models import AuditEvent
from harness.accounts import PASSWORD
from tests.support.console import console_user

pytestmark = pytest.mark.django_db


def _events(kind: str) -> list[dict[str, Any]]:
    return list(
        AuditEvent.objects.filter(operation_key=SYSTEM_CHAIN, kind=kind)
        .order_by("seq")
        .values_list("data", flat=True)
    )


def test_a_password_sign_in_and_its_sign_out_are_on_the_record() -> None:
    console_user("olivia")
    client = Client(REMOTE_ADDR="198.51.100.4")
    assert client.post("/login/", {"login": "olivia", "password": PASSWORD}).status_code == 302
    (signed_in,) = _events(AuditKind.SIGNED_IN)
    assert signed_in == {
        "user": "olivia",
        "user_id": signed_in["user_id"],
        "method": "password",
        "address": "198.51.100.4",
    }  # no break_glass: single sign-on is off
    assert client.post("/logout/").status_code == 302
    (signed_out,) = _events(AuditKind.SIGNED_OUT)
    assert signed_out["user"] == "olivia" and signed_out["address"] == "198.51.100.4"


def test_a_wrong_password_is_on_the_record_without_the_password() -> None:
    console_user("olivia")
    Client(REMOTE_ADDR="198.51.100.4").post("/login/", {"login": "olivia", "password": "nope"})
    (failed,) = _events(AuditKind.SIGN_IN_FAILED)
    assert failed == {
        "username": "olivia",
        "reason": "wrong_credentials",
        "address": "198.51.100.4",
    }


def test_one_address_records_a_bounded_number_of_failures_a_minute(settings: Any) -> None:
    settings.SETTLE_REFUSALS_RECORDED_PER_MINUTE = 3
    client = Client(REMOTE_ADDR="203.0.113.9")
    # Early in a minute, so that all six fall in it.
    with time_machine.travel(datetime(2026, 12, 3, 12, 0, 5, tzinfo=UTC), tick=True):
        for n in range(6):  # a username each: django-axes locks a pair out after 5
            client.post("/login/", {"login": f"guess-{n}", "password": "nope"})
    assert [e["username"] for e in _events(AuditKind.SIGN_IN_FAILED)] == [
        "guess-0",
        "guess-1",
        "guess-2",
    ]
    # Another address still has its own.
    Client(REMOTE_ADDR="198.51.100.4").post("/login/", {"login": "x", "password": "nope"})
    assert _events(AuditKind.SIGN_IN_FAILED)[-1]["address"] == "198.51.100.4"


def test_a_login_with_no_request_behind_it_is_no_sign_in() -> None:
    Client().force_login(console_user("olivia"))
    assert _events(AuditKind.SIGNED_IN) == []
