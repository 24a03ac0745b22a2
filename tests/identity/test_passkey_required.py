"""SETTLE_REQUIRE_PASSKEY_FOR: its values, and the middleware that holds a supervisor
until they have used a passkey in their session (Django's test client; the ceremonies
themselves are in browser/test_passkeys_browser.py)."""

from __future__ import annotations

import time

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, RequestFactory

from console.settings_identity import _require_passkey_for
from identity.passkeys import PasskeyRequiredMiddleware
from tests.support.console import PASSWORD, console_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def required(settings):
    settings.SETTLE_REQUIRE_PASSKEY_FOR = "supervisor"


@pytest.fixture
def supervisor(provider):
    return console_user("sam", "supervisor", provider)


def _signed_in(user, *, passkey: bool = False) -> Client:
    client = Client()
    client.force_login(user)
    if passkey:
        session = client.session
        session["account_authentication_methods"] = [
            {"method": "mfa", "type": "webauthn", "id": 1, "at": time.time()}
        ]
        session["account_authentication_methods_user"] = str(user.pk)
        session.save()
    return client


@pytest.mark.parametrize("value", ["", "supervisor", " supervisor "])
def test_require_passkey_for_takes_nobody_or_supervisors(monkeypatch, value):
    monkeypatch.setenv("SETTLE_REQUIRE_PASSKEY_FOR", value)
    assert _require_passkey_for() == value.strip()


@pytest.mark.parametrize("value", ["supervisors", "operator", "all", "Supervisor"])
def test_require_passkey_for_refuses_anything_else(monkeypatch, value):
    monkeypatch.setenv("SETTLE_REQUIRE_PASSKEY_FOR", value)
    with pytest.raises(ImproperlyConfigured, match="SETTLE_REQUIRE_PASSKEY_FOR"):
        _require_passkey_for()


def test_require_passkey_for_is_off_unless_set(monkeypatch):
    monkeypatch.delenv("SETTLE_REQUIRE_PASSKEY_FOR", raising=False)
    assert _require_passkey_for() == ""


def test_supervisor_without_a_passkey_is_held_on_every_console_page(required, supervisor):
    client = _signed_in(supervisor)
    for path in ("/", "/reconciliations/", "/dashboard/", "/audit/", "/status/"):
        response = client.get(path)
        assert response.status_code == 302, path
        assert response["Location"] == "/passkey-required/"
    page = client.get("/passkey-required/")
    assert page.status_code == 200
    assert b"data-passkey-required" in page.content
    assert b"Register a passkey" in page.content


def test_held_supervisor_reaches_passkey_pages_and_sign_out(required, supervisor):
    client = _signed_in(supervisor)
    assert client.get("/accounts/2fa/webauthn/").status_code == 200
    assert client.get("/accounts/2fa/").status_code == 302  # to the list, not the holding page
    # Registering asks for the password again (no sign-in step recorded here): allowed too.
    add = client.get("/accounts/2fa/webauthn/add/")
    assert add.status_code == 302
    assert add["Location"].startswith("/accounts/reauthenticate/")
    assert client.get(add["Location"]).status_code == 200
    assert client.get("/static/settle/settle.css").status_code in (200, 404)
    signed_out = client.post("/logout/")
    assert signed_out.status_code == 302
    assert signed_out["Location"] != "/passkey-required/"
    assert "_auth_user_id" not in client.session


def test_htmx_request_of_a_held_supervisor_is_redirected_by_htmx(required, supervisor):
    response = _signed_in(supervisor).get("/", HTTP_HX_REQUEST="true")
    assert response.status_code == 403
    assert response["HX-Redirect"] == "/passkey-required/"


def test_supervisor_who_used_a_passkey_is_not_held(required, supervisor):
    assert _signed_in(supervisor, passkey=True).get("/").status_code == 200


def test_a_passkey_record_of_someone_else_does_not_count(required, supervisor, operator):
    client = _signed_in(supervisor, passkey=True)
    session = client.session
    session["account_authentication_methods_user"] = str(operator.pk)
    session.save()
    assert client.get("/").status_code == 302


def test_operator_is_not_held(required, operator):
    assert _signed_in(operator).get("/").status_code == 200


def test_nobody_is_held_when_not_required(supervisor):
    assert _signed_in(supervisor).get("/").status_code == 200


def test_role_granted_in_an_open_session_holds_from_the_next_request(required, operator, provider):
    from approvals.actors import Actor
    from recovery.services.roles import role_grant

    client = _signed_in(operator)
    assert client.get("/").status_code == 200
    role_grant(user=operator, role="supervisor", provider=provider, actor=Actor.system("t"))
    assert client.get("/").status_code == 302


def _through_middleware(request) -> int:
    seen = []
    PasskeyRequiredMiddleware(lambda r: seen.append(r) or None)(request)  # type: ignore[arg-type,func-returns-value]
    return len(seen)


def test_middleware_asks_nothing_of_the_database_for_anonymous_or_passkey_users(
    required, supervisor, django_assert_num_queries
):
    from django.contrib.auth.models import AnonymousUser

    factory = RequestFactory()
    anonymous = factory.get("/")
    anonymous.user = AnonymousUser()
    anonymous.session = {}
    with django_assert_num_queries(0):
        assert _through_middleware(anonymous) == 1

    marked = factory.get("/")
    marked.user = supervisor
    marked.session = {
        "account_authentication_methods": [{"method": "mfa", "type": "webauthn", "at": 1.0}],
        "account_authentication_methods_user": str(supervisor.pk),
    }
    with django_assert_num_queries(0):
        assert _through_middleware(marked) == 1


def test_middleware_asks_one_statement_of_a_user_without_the_mark_and_shares_it(
    required, operator, django_assert_num_queries
):
    request = RequestFactory().get("/")
    request.user = operator
    request.session = {}
    with django_assert_num_queries(1):
        assert _through_middleware(request) == 1
    assert request._settle_supervising is False  # the navigation's answer, asked once


def test_middleware_costs_nothing_when_not_required(supervisor, django_assert_num_queries):
    request = RequestFactory().get("/")
    request.user = supervisor
    request.session = {}
    with django_assert_num_queries(0):
        assert _through_middleware(request) == 1


def test_confirmation_page_is_a_console_page_that_takes_the_password(supervisor):
    client = _signed_in(supervisor)  # no sign-in step recorded: registering asks again
    page = client.get("/accounts/reauthenticate/?next=/accounts/2fa/webauthn/add/")
    assert page.status_code == 200
    assert b'class="card narrow"' in page.content
    confirmed = client.post(
        "/accounts/reauthenticate/?next=/accounts/2fa/webauthn/add/", {"password": PASSWORD}
    )
    assert confirmed.status_code == 302
    assert confirmed["Location"] == "/accounts/2fa/webauthn/add/"
    assert client.get("/accounts/2fa/webauthn/add/").status_code == 200
