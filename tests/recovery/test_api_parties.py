"""The host API's parties: an enrolment link for a customer, their passkeys, revoking one;
a host sees only its own parties, and every refusal has its code."""

from __future__ import annotations

import pytest

from approvals.models import PartyPasskey
from approvals.services.parties import party_passkey_enrol
from audit.kinds import AuditKind
from audit.models import AuditEvent
from harness.webauthn import SoftPasskey
from tests.support.flow import Api

pytestmark = pytest.mark.django_db


def _enrolled(host_api: Api, party: str = "cust_8812") -> PartyPasskey:
    answer = host_api.post(f"/api/v1/parties/{party}/enrolments", {"name": "Ada"})
    token = answer.json()["url"].split("#", 1)[1]
    key = SoftPasskey()
    return party_passkey_enrol(token=token, credential_id=key.id, public_key=key.public_key)


def _delete(api: Api, path: str):
    return api.client.delete(path, HTTP_AUTHORIZATION=f"Bearer {api.token}")


def test_a_host_gets_a_one_time_enrolment_link_with_the_token_in_its_fragment(host_api, settings):
    settings.SETTLE_CUSTOMER_URL = "https://settle.example.com"
    answer = host_api.post("/api/v1/parties/cust_8812/enrolments", {"name": "Ada"})
    assert answer.status_code == 201, answer.content
    body = answer.json()
    base, token = body["url"].split("#", 1)
    assert base == "https://settle.example.com/enrol/" and token.startswith("ste_")
    assert body["party"] == "cust_8812" and body["expires_at"]
    event = AuditEvent.objects.get(kind=AuditKind.PARTY_ENROLMENT_REQUESTED)
    assert event.actor.kind == "host" and token not in str(event.data)


def test_the_enrolment_body_may_be_left_out(host_api):
    answer = host_api.client.post(
        "/api/v1/parties/cust_1/enrolments",
        "",
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {host_api.token}",
    )
    assert answer.status_code == 201, answer.content


def test_a_party_id_the_api_cannot_name_is_refused(host_api):
    answer = host_api.post("/api/v1/parties/-bad/enrolments", {})
    assert answer.status_code == 422 and answer.json()["error"] == "invalid_field"


def test_an_unknown_field_is_refused(host_api):
    answer = host_api.post("/api/v1/parties/cust_1/enrolments", {"phone": "123"})
    assert answer.status_code == 400 and answer.json()["error"] == "unknown_field"


def test_a_host_lists_its_partys_passkeys(host_api):
    passkey = _enrolled(host_api)
    answer = host_api.get("/api/v1/parties/cust_8812")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["display_name"] == "Ada"
    assert [p["id"] for p in body["passkeys"]] == [passkey.pk]
    assert body["passkeys"][0]["removed_at"] is None


def test_another_hosts_party_is_unknown(host_api, other_host_api):
    passkey = _enrolled(host_api)
    assert other_host_api.get("/api/v1/parties/cust_8812").json()["error"] == "unknown_party"
    answer = _delete(other_host_api, f"/api/v1/parties/cust_8812/passkeys/{passkey.pk}")
    assert answer.status_code == 404 and answer.json()["error"] == "unknown_party"
    assert PartyPasskey.objects.get().removed_at is None


def test_a_host_revokes_a_passkey_once(host_api):
    passkey = _enrolled(host_api)
    answer = _delete(host_api, f"/api/v1/parties/cust_8812/passkeys/{passkey.pk}")
    assert answer.status_code == 200, answer.content
    assert answer.json()["removed"] is True and answer.json()["passkey"]["removed_at"]
    again = _delete(host_api, f"/api/v1/parties/cust_8812/passkeys/{passkey.pk}")
    assert again.json()["removed"] is False
    assert AuditEvent.objects.filter(kind=AuditKind.PARTY_PASSKEY_REMOVED).count() == 1
    listed = host_api.get("/api/v1/parties/cust_8812").json()["passkeys"]
    assert listed[0]["removed_at"]


def test_an_unknown_passkey_is_refused(host_api):
    _enrolled(host_api)
    for passkey_id in ("999999", "abc"):
        answer = _delete(host_api, f"/api/v1/parties/cust_8812/passkeys/{passkey_id}")
        assert answer.status_code == 404 and answer.json()["error"] == "unknown_passkey"


def test_an_approver_may_not_ask_for_enrolment(approver_api):
    answer = approver_api.post("/api/v1/parties/cust_1/enrolments", {})
    assert answer.status_code == 403 and answer.json()["error"] == "forbidden"
