"""SETTLE_REQUIRE_PASSKEY_FOR: its values, and the middleware that holds a supervisor or
an approver until they have used a passkey in their session, in the console and in the
API alike (Django's test client; the ceremonies themselves are in
browser/test_passkeys_browser.py)."""

from __future__ import annotations

import time

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, RequestFactory

from approvals.models import Approval
from audit.kinds import AuditKind
from audit.models import AuditEvent
from common.actors import Actor
from harness.accounts import PASSWORD
from harness.providers import digest_of
from identity.passkeys import PasskeyRequiredMiddleware
from recovery.models import Operation
from settle.settings_identity import _require_passkey_for
from tests.support.console import console_user, pending_approval
from tests.support.flow import PARAMS

pytestmark = pytest.mark.django_db


@pytest.fixture
def required(settings):
    settings.SETTLE_REQUIRE_PASSKEY_FOR = ("supervisor",)


@pytest.fixture
def deciders(settings):
    settings.SETTLE_REQUIRE_PASSKEY_FOR = ("supervisor", "approver")


@pytest.fixture
def supervisor(provider):
    return console_user("sam", "supervisor", provider)


@pytest.fixture
def decider(provider):
    """Someone who may decide approvals on ``orders`` and do nothing else a supervisor may."""
    return console_user("dana", "decide_approvals", provider)


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


@pytest.mark.parametrize(
    ("value", "roles"),
    [
        ("", ()),
        ("none", ()),
        (" none ", ()),
        ("supervisor", ("supervisor",)),
        (" supervisor ", ("supervisor",)),
        ("approver", ("approver",)),
        ("approver, supervisor", ("supervisor", "approver")),
        ("supervisor,approver,", ("supervisor", "approver")),
    ],
)
@pytest.mark.parametrize("https", [False, True])
def test_require_passkey_for_names_the_roles_it_holds(monkeypatch, value, roles, https):
    monkeypatch.setenv("SETTLE_REQUIRE_PASSKEY_FOR", value)
    assert _require_passkey_for(https=https) == roles


@pytest.mark.parametrize(
    "value",
    ["supervisors", "operator", "all", "Supervisor", "supervisor;approver", "none,approver"],
)
def test_require_passkey_for_refuses_anything_else(monkeypatch, value):
    monkeypatch.setenv("SETTLE_REQUIRE_PASSKEY_FOR", value)
    with pytest.raises(ImproperlyConfigured, match=r"SETTLE_REQUIRE_PASSKEY_FOR=.*approver"):
        _require_passkey_for(https=True)


def test_require_passkey_for_is_off_unless_set_or_https(monkeypatch):
    monkeypatch.delenv("SETTLE_REQUIRE_PASSKEY_FOR", raising=False)
    assert _require_passkey_for(https=False) == ()


def test_require_passkey_for_holds_everyone_who_decides_by_default_behind_https(monkeypatch):
    monkeypatch.delenv("SETTLE_REQUIRE_PASSKEY_FOR", raising=False)
    assert _require_passkey_for(https=True) == ("supervisor", "approver")


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
    # Not held: the stylesheet itself, not a redirect to the holding page.
    assert client.get("/static/settle/settle.css").status_code == 200
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


def test_approver_with_only_decide_approvals_is_held_when_approvers_are_named(deciders, decider):
    response = _signed_in(decider).get("/approvals/")
    assert (response.status_code, response["Location"]) == (302, "/passkey-required/")
    assert _signed_in(decider, passkey=True).get("/approvals/").status_code == 200


def test_approver_is_not_held_when_only_supervisors_are_named(required, decider):
    assert _signed_in(decider).get("/approvals/").status_code == 200


def test_operator_is_not_held_when_approvers_are_named(deciders, operator):
    assert _signed_in(operator).get("/").status_code == 200


def _password_session(username: str) -> tuple[Client, str]:
    """A browser that signed in with a password, as a person does, and its CSRF token."""
    browser = Client(enforce_csrf_checks=True)
    browser.get("/login/")
    signed_in = browser.post(
        "/login/",
        {
            "login": username,
            "password": PASSWORD,
            "csrfmiddlewaretoken": browser.cookies["csrftoken"].value,
        },
    )
    assert signed_in.status_code == 302, signed_in.content
    assert "_auth_user_id" in browser.session
    return browser, browser.cookies["csrftoken"].value


def _decide(browser: Client, csrf: str, approval: Approval, **headers: str):
    return browser.post(
        f"/api/v1/approvals/{approval.pk}/decision",
        data={"decision": "approve", "ttl_seconds": 604800, "params_digest": digest_of(PARAMS)},
        content_type="application/json",
        HTTP_X_CSRFTOKEN=csrf,
        **headers,
    )


def test_held_supervisor_cannot_decide_through_the_api_with_their_session(
    required, supervisor, flow
):
    approval = pending_approval(flow, "op-1")
    browser, csrf = _password_session("sam")
    assert browser.get("/")["Location"] == "/passkey-required/"  # held in the console
    response = _decide(browser, csrf, approval)
    assert (response.status_code, response.json()["error"]) == (403, "passkey_required")
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING
    assert not approval.votes.exists()
    assert Operation.objects.get(key="op-1").state == "awaiting_approval"
    refused = AuditEvent.objects.get(kind=AuditKind.PASSKEY_HOLD_REFUSED)
    assert refused.actor == Actor.of("user", supervisor)
    assert refused.data["method"] == "POST"
    assert refused.data["path"] == f"/api/v1/approvals/{approval.pk}/decision"
    assert refused.data["code"] == "passkey_required"


def test_held_approver_cannot_read_an_approval_through_the_api_with_their_session(
    deciders, decider, flow
):
    approval = pending_approval(flow, "op-1")
    browser, _ = _password_session("dana")
    response = browser.get(f"/api/v1/approvals/{approval.pk}")
    assert (response.status_code, response.json()["error"]) == (403, "passkey_required")
    assert AuditEvent.objects.filter(kind=AuditKind.PASSKEY_HOLD_REFUSED).count() == 1


def test_held_approver_cannot_decide_through_the_api_with_their_session(deciders, decider, flow):
    approval = pending_approval(flow, "op-1")
    browser, csrf = _password_session("dana")
    response = _decide(browser, csrf, approval)
    assert (response.status_code, response.json()["error"]) == (403, "passkey_required")
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING


def test_supervisor_who_used_a_passkey_decides_through_the_api(required, supervisor, flow):
    approval = pending_approval(flow, "op-1")
    browser = _signed_in(supervisor, passkey=True)
    response = _decide(browser, "", approval)  # force_login: CSRF checks off
    assert (response.status_code, response.json()["status"]) == (200, "approved")
    assert not AuditEvent.objects.filter(kind=AuditKind.PASSKEY_HOLD_REFUSED).exists()


def test_a_token_call_from_a_held_browser_is_the_tokens_and_is_not_held(deciders, decider, flow):
    approval = pending_approval(flow, "op-1")
    browser, csrf = _password_session("dana")
    response = _decide(
        browser, csrf, approval, HTTP_AUTHORIZATION=f"Bearer {flow.approver_api.token}"
    )
    assert (response.status_code, response.json()["status"]) == (200, "approved")
    approval.refresh_from_db()
    assert approval.decided_by.kind == "approver"


@pytest.mark.parametrize(
    ("authorization", "status", "code"), [("", 403, "passkey_required"), (" ", 401, "unauthorized")]
)
def test_an_empty_authorization_header_does_not_lift_the_hold(
    deciders, decider, flow, authorization, status, code
):
    """An empty header is no token: the API takes the session, so the hold holds it. One
    that says something is the token's to answer for (here: none, 401)."""
    approval = pending_approval(flow, "op-1")
    browser, csrf = _password_session("dana")
    response = _decide(browser, csrf, approval, HTTP_AUTHORIZATION=authorization)
    assert (response.status_code, response.json()["error"]) == (status, code)
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING


def test_held_approvers_console_decision_is_sent_away_and_recorded(deciders, decider, flow):
    approval = pending_approval(flow, "op-1")
    browser, csrf = _password_session("dana")
    response = browser.post(
        f"/approvals/{approval.pk}/decide",
        {"decision": "approve", "params_digest": digest_of(PARAMS), "csrfmiddlewaretoken": csrf},
    )
    assert (response.status_code, response["Location"]) == (302, "/passkey-required/")
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING
    refused = AuditEvent.objects.get(kind=AuditKind.PASSKEY_HOLD_REFUSED)
    assert refused.data["method"] == "POST"
    assert refused.data["held_for"] == ["supervisor", "approver"]


def test_the_api_document_stays_open_to_a_held_session(required, supervisor):
    assert _signed_in(supervisor).get("/api/openapi.json").status_code == 200


def test_role_granted_in_an_open_session_holds_from_the_next_request(required, operator, provider):
    from common.actors import Actor
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
    assert request._settle_roles.supervises is False  # the navigation's answer, asked once


def test_middleware_asks_one_statement_for_supervisors_and_approvers_alike(
    deciders, operator, django_assert_num_queries
):
    request = RequestFactory().get("/")
    request.user = operator
    request.session = {}
    with django_assert_num_queries(1):
        assert _through_middleware(request) == 1


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


def test_a_held_sessions_path_with_a_nul_byte_is_refused_and_recorded(required, supervisor):
    response = _signed_in(supervisor).get("/api/v1/approvals/a%00b")
    assert (response.status_code, response.json()["error"]) == (403, "passkey_required")
    refused = AuditEvent.objects.get(kind=AuditKind.PASSKEY_HOLD_REFUSED)
    assert refused.data["path"] == "/api/v1/approvals/ab"
