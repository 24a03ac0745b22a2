"""The enrolment page: the customer registers a passkey from the host's one-time link. GET
changes nothing; fido2 verifies the browser's answer; two tabs on one link: one passkey."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from approvals.models import PartyEnrolment, PartyPasskey
from approvals.services.parties import party_enrolment_request
from common.actors import Actor
from customers.pages import CONTENT_SECURITY_POLICY
from harness.webauthn import SoftPasskey

pytestmark = pytest.mark.django_db

HOST = Actor("host", "1", "fleet-a")


@pytest.fixture
def browser() -> Client:
    client = Client(enforce_csrf_checks=True, HTTP_HOST="localhost:8000")
    client.get("/enrol/")
    return client


def _post(client: Client, path: str, body: dict[str, Any]):
    return client.post(
        path,
        json.dumps(body),
        content_type="application/json",
        HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value,
    )


def _token() -> str:
    return party_enrolment_request(
        host="fleet-a", party="cust_1", actor=HOST, display_name="Ada Lovelace"
    )[1]


def _enrol(client: Client, token: str, key: SoftPasskey, name: str = "My phone"):
    options = _post(client, "/enrol/options", {"token": token})
    assert options.status_code == 200, options.content
    body = options.json()
    credential = key.registration(challenge=body["publicKey"]["challenge"])["credential"]
    return _post(
        client,
        "/enrol/finish",
        {"token": token, "state": body["state"], "credential": credential, "name": name},
    )


def test_the_page_has_the_customer_headers_and_opening_it_changes_nothing(browser):
    _token()
    page = browser.get("/enrol/")
    assert page.status_code == 200
    assert page["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert page["Cache-Control"] == "no-store" and page["Referrer-Policy"] == "no-referrer"
    assert "'unsafe-inline'" not in page["Content-Security-Policy"]
    assert PartyEnrolment.objects.get().used_at is None


def test_options_name_the_party_and_require_user_verification(browser):
    options = _post(browser, "/enrol/options", {"token": _token()})
    body = options.json()
    assert body["display_name"] == "Ada Lovelace"
    assert body["publicKey"]["rp"]["id"] == "localhost"
    assert body["publicKey"]["authenticatorSelection"]["userVerification"] == "required"
    assert options["Cache-Control"] == "no-store"


def test_a_customer_enrols_a_passkey_from_the_link(browser):
    key = SoftPasskey()
    answer = _enrol(browser, _token(), key)
    assert answer.status_code == 201, answer.content
    passkey = PartyPasskey.objects.get()
    assert passkey.credential_id == key.id and passkey.public_key == key.public_key
    assert passkey.name == "My phone"


def test_two_tabs_on_one_link_enrol_one_passkey(browser):
    token = _token()
    first = _post(browser, "/enrol/options", {"token": token}).json()
    second = _post(browser, "/enrol/options", {"token": token}).json()
    answers = [
        _post(
            browser,
            "/enrol/finish",
            {
                "token": token,
                "state": options["state"],
                "credential": SoftPasskey().registration(
                    challenge=options["publicKey"]["challenge"]
                )["credential"],
            },
        )
        for options in (first, second)
    ]
    assert [a.status_code for a in answers] == [201, 409]
    assert answers[1].json()["error"] == "enrolment_used"
    assert PartyPasskey.objects.count() == 1


def test_a_used_link_is_told_so_before_anything_is_asked(browser):
    token = _token()
    _enrol(browser, token, SoftPasskey())
    answer = _post(browser, "/enrol/options", {"token": token})
    assert answer.status_code == 409 and answer.json()["error"] == "enrolment_used"


def test_an_unknown_link_is_refused(browser):
    answer = _post(browser, "/enrol/options", {"token": "ste_nothing"})
    assert answer.status_code == 404 and answer.json()["error"] == "enrolment_unknown"
    assert answer.json()["message"] == "This link is not valid. Ask the app for a new one."


def test_the_page_and_its_refusals_speak_the_browsers_language(db):
    german = Client(enforce_csrf_checks=True, HTTP_ACCEPT_LANGUAGE="de-DE,de;q=0.9,en;q=0.5")
    page = german.get("/enrol/")
    html = page.content.decode()
    assert page["Content-Language"] == "de" and '<html lang="de">' in html
    assert "Passkey hinzufügen" in html and "Ihr Link wird geprüft" in html
    assert 'data-msg-added="Passkey hinzugefügt.' in html  # what the script says, too
    answer = _post(german, "/enrol/options", {"token": "ste_nothing"})
    assert answer.json() == {
        "error": "enrolment_unknown",  # the code stays the code
        "message": "Dieser Link ist ungültig. Bitten Sie die App um einen neuen.",
    }


def test_an_answer_to_another_challenge_enrols_nothing(browser):
    token = _token()
    options = _post(browser, "/enrol/options", {"token": token}).json()
    credential = SoftPasskey().registration(challenge="AAAA")["credential"]
    answer = _post(
        browser,
        "/enrol/finish",
        {"token": token, "state": options["state"], "credential": credential},
    )
    assert answer.status_code == 403 and answer.json()["error"] == "registration_invalid"
    assert not PartyPasskey.objects.exists()
    assert PartyEnrolment.objects.get().used_at is None


def test_a_forged_state_enrols_nothing(browser):
    token = _token()
    options = _post(browser, "/enrol/options", {"token": token}).json()
    credential = SoftPasskey().registration(challenge=options["publicKey"]["challenge"])[
        "credential"
    ]
    answer = _post(
        browser,
        "/enrol/finish",
        {"token": token, "state": options["state"] + "x", "credential": credential},
    )
    assert answer.json()["error"] == "registration_invalid"
    assert not PartyPasskey.objects.exists()


def test_a_state_of_another_link_enrols_nothing(browser):
    token, other = _token(), _token()
    options = _post(browser, "/enrol/options", {"token": other}).json()
    credential = SoftPasskey().registration(challenge=options["publicKey"]["challenge"])[
        "credential"
    ]
    answer = _post(
        browser,
        "/enrol/finish",
        {"token": token, "state": options["state"], "credential": credential},
    )
    assert answer.json()["error"] == "registration_invalid"


def test_a_post_without_the_csrf_token_is_refused(browser):
    answer = browser.post(
        "/enrol/options", json.dumps({"token": _token()}), content_type="application/json"
    )
    assert answer.status_code == 403


def test_a_body_that_is_not_json_is_refused(browser):
    answer = browser.post(
        "/enrol/finish",
        "nope",
        content_type="application/json",
        HTTP_X_CSRFTOKEN=browser.cookies["csrftoken"].value,
    )
    assert answer.status_code == 400 and answer.json()["error"] == "malformed_json"


def test_too_many_tries_from_one_address_are_refused(browser, settings):
    settings.SETTLE_LINK_TRIES_PER_MINUTE = 2
    token = _token()
    answers = [_post(browser, "/enrol/options", {"token": token}) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[2].json()["error"] == "link_rate_limited"
