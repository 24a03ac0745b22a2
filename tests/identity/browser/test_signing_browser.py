"""A decision signed in a real browser: Chromium's virtual authenticator answers
``identity.passkey_signing``'s request, and what it returns is the record Settle keeps.

The approval page's buttons are tested in ``test_browser_sign_approval.py``; here the
page's own script signs a statement of the test's on a console page of the signed-in
person, with the options ``signing_options`` made, and the browser's JSON goes to
``signed_record_verify`` directly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page

from common.actors import Actor
from common.errors import SettleError
from common.statements import statement
from identity.models import PasskeyUse
from identity.passkey_signing import signed_record_verify, signing_options
from tests.support.browser import passkey_register_in, sign_in

pytestmark = pytest.mark.django_db(transaction=True)

RP_ID = "localhost"  # the live server is reached as http://localhost

# The approval page's own script (static/settle/sign.js): navigator.credentials.get on
# signing_options' JSON, and the credential as WebAuthn's JSON (base64url) back.
SIGN_JS = Path(__file__).resolve().parents[3] / "static" / "settle" / "sign.js"
# What it stands on: the ceremony in WebAuthn's JSON form, which the page loads first.
WEBAUTHN_JS = SIGN_JS.with_name("webauthn.js")
SIGN = "(options) => window.settleSigned(options)"


def _statement(user: Any, decision: str = "approve") -> dict[str, str]:
    return statement(
        "approval",
        approval_id="6f1c1a8e-1b47-4a4e-9d3c-0f3a7f5a9e11",
        operation_key="op-1",
        params_digest="sha256:" + "a" * 64,
        decision=decision,
        person=Actor.of("user", user).stored,
    )


def test_chromiums_passkey_signs_a_decision_that_verifies(page: Page, authenticator, operator):
    sign_in(page, operator.username)
    passkey_register_in(page, "Work laptop")
    signed = _statement(operator)
    options = signing_options(user=operator, statement=signed, rp_id=RP_ID)
    page.add_script_tag(path=str(WEBAUTHN_JS))
    page.add_script_tag(path=str(SIGN_JS))
    assertion = page.evaluate(SIGN, options)
    record = signed_record_verify(
        user=operator, statement=signed, assertion_json=assertion, rp_id=RP_ID
    )
    assert record["statement"] == signed
    (credential,) = authenticator.credentials()
    assert record["credential_id"] == credential["credentialId"].rstrip("=").replace(
        "+", "-"
    ).replace("/", "_")
    assert PasskeyUse.objects.get(credential_id=record["credential_id"]).sign_count >= 1

    # The same answer again: its sign count did not grow.
    with pytest.raises(SettleError) as replayed:
        signed_record_verify(user=operator, statement=signed, assertion_json=assertion, rp_id=RP_ID)
    assert replayed.value.code == "sign_count_replayed"


def test_a_passkey_not_unlocked_signs_nothing(page: Page, authenticator, operator):
    sign_in(page, operator.username)
    passkey_register_in(page, "Phone")
    authenticator.user_verified(False)
    options = signing_options(user=operator, statement=_statement(operator), rp_id=RP_ID)
    page.add_script_tag(path=str(WEBAUTHN_JS))
    page.add_script_tag(path=str(SIGN_JS))
    # The browser itself refuses: the request requires user verification.
    with pytest.raises(PlaywrightError, match="NotAllowedError"):
        page.evaluate(SIGN, options)
