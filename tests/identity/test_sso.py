"""Single sign-on against a real OpenID Connect provider (``harness.oidc``): accounts
made at the first sign-on, roles from groups, and every refusal a page, an audit event,
and nothing half-created."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from allauth.socialaccount.models import SocialAccount
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from audit.hashing import SYSTEM_CHAIN
from audit.kinds import AuditKind
from audit.models import AuditEvent
from harness.accounts import PASSWORD
from harness.oidc import IdentityProvider
from harness.sso import CALLBACK, sso_on, sso_sign_in, sso_start
from identity.metrics import BREAK_GLASS_SIGN_INS
from recovery.models import Provider
from recovery.permissions import ProviderPermission as P
from tests.support.console import console_user

pytestmark = [pytest.mark.processes, pytest.mark.django_db]


def _events(kind: str) -> list[dict[str, Any]]:
    return list(
        AuditEvent.objects.filter(operation_key=SYSTEM_CHAIN, kind=kind)
        .order_by("seq")
        .values_list("data", flat=True)
    )


def _can(user: User, permission: P, provider: Provider) -> bool:
    fresh = User.objects.get(pk=user.pk)  # guardian caches a user object's permissions
    return fresh.has_perm(permission.perm, provider)


def _signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


@pytest.fixture
def sso(settings: Any, idp: IdentityProvider, tmp_path: Path) -> IdentityProvider:
    sso_on(settings, idp, tmp_path)
    return idp


def test_the_sign_in_request_carries_state_nonce_and_pkce(sso: IdentityProvider) -> None:
    query = parse_qs(urlsplit(sso_start(Client())).query)
    assert query["response_type"] == ["code"]
    assert query["code_challenge_method"] == ["S256"] and query["code_challenge"][0]
    assert len(query["state"][0]) >= 12 and len(query["nonce"][0]) >= 32
    assert sorted(query["scope"][0].split()) == ["email", "openid", "profile"]


def test_the_first_sign_on_makes_the_account_keyed_on_the_subject_with_its_groups_roles(
    sso: IdentityProvider, provider: Provider, other_provider: Provider
) -> None:
    sso.directory.person("ada", groups=["settle-operators"], sub="sub-ada-1")
    client = Client()
    response = sso_sign_in(client, sso, "ada")
    assert response.status_code == 302 and response["Location"] == "/"
    account = SocialAccount.objects.get(provider="sso")
    assert account.uid == "sub-ada-1"
    user = account.user
    assert not user.has_usable_password()  # signs in through the directory alone
    for target in (provider, other_provider):  # "*": every provider
        assert _can(user, P.VOID_OPERATIONS, target)
        assert not _can(user, P.APPROVE_RECONCILIATIONS, target)
    assert client.get("/").status_code == 200
    (signed_in,) = _events(AuditKind.SIGNED_IN)
    assert signed_in["method"] == "sso" and signed_in["subject"] == "sub-ada-1"
    assert signed_in["groups"] == ["settle-operators"]
    (synced,) = _events(AuditKind.ROLES_SYNCED)
    assert synced["roles"] == {"operator": ["*"]} and synced["removed"] == {}
    assert set(synced["added"]) == {"orders", "ledger"}


def test_groups_changed_at_the_provider_change_the_roles_at_the_next_sign_on(
    sso: IdentityProvider, provider: Provider
) -> None:
    sso.directory.person("ada", groups=["settle-operators", "orders-leads"])
    sso_sign_in(Client(), sso, "ada")
    user = User.objects.get(socialaccount__provider="sso")
    assert _can(user, P.APPROVE_RECONCILIATIONS, provider)

    sso.directory.groups("ada", ["settle-viewers"])
    client = Client()
    assert sso_sign_in(client, sso, "ada").status_code == 302
    assert _can(user, P.VIEW_OPERATIONS, provider)
    assert not _can(user, P.VOID_OPERATIONS, provider)
    assert not _can(user, P.APPROVE_RECONCILIATIONS, provider)
    assert User.objects.count() == 1  # the same account: the subject did not change
    second = _events(AuditKind.ROLES_SYNCED)[-1]
    assert second["groups"] == ["settle-viewers"]
    assert "approve_reconciliations" in second["removed"]["orders"]
    assert "view_operations" not in second["removed"]["orders"]
    assert second["added"] == {}

    # The same groups again: nothing to change, nothing recorded.
    sso_sign_in(Client(), sso, "ada")
    assert len(_events(AuditKind.ROLES_SYNCED)) == 2


def test_directory_groups_become_the_persons_groups_for_approval_policies(
    sso: IdentityProvider, provider: Provider
) -> None:
    sso.directory.person("ada", groups=["settle-operators", "orders-leads"])
    sso_sign_in(Client(), sso, "ada")
    user = User.objects.get(socialaccount__provider="sso")
    assert set(user.groups.values_list("name", flat=True)) == {"settle-operators", "orders-leads"}
    first = _events(AuditKind.ROLES_SYNCED)[-1]
    assert first["groups_joined"] == ["orders-leads", "settle-operators"]

    sso.directory.groups("ada", ["settle-operators", "finance"])
    sso_sign_in(Client(), sso, "ada")
    assert set(user.groups.values_list("name", flat=True)) == {"settle-operators", "finance"}
    second = _events(AuditKind.ROLES_SYNCED)[-1]
    assert (second["groups_joined"], second["groups_left"]) == (["finance"], ["orders-leads"])


def test_a_person_out_of_the_allowed_groups_is_refused_and_loses_the_roles(
    settings: Any, idp: IdentityProvider, tmp_path: Path, provider: Provider
) -> None:
    sso_on(settings, idp, tmp_path, allowed_groups=("settle-operators", "settle-viewers"))
    idp.directory.person("ada", groups=["settle-operators"])
    sso_sign_in(Client(), idp, "ada")
    user = User.objects.get(socialaccount__provider="sso")
    assert _can(user, P.VIEW_OPERATIONS, provider)

    idp.directory.groups("ada", ["marketing"])
    client = Client()
    refused = sso_sign_in(client, idp, "ada")
    assert refused.status_code == 403
    assert b'data-refusal="sso_group_not_allowed"' in refused.content
    assert not _signed_in(client)
    assert not _can(user, P.VIEW_OPERATIONS, provider)
    (event,) = _events(AuditKind.SIGN_IN_REFUSED)
    assert event["code"] == "sso_group_not_allowed" and event["groups"] == ["marketing"]
    assert _events(AuditKind.ROLES_SYNCED)[-1]["removed"]["orders"]


def test_groups_that_map_to_nothing_sign_in_to_an_empty_console_that_says_why(
    sso: IdentityProvider, provider: Provider
) -> None:
    sso.directory.person("ada", groups=["marketing", "london"])
    client = Client()
    assert sso_sign_in(client, sso, "ada").status_code == 302
    page = client.get("/")
    assert page.status_code == 200
    assert b"Your directory groups (london, marketing) give you no role" in page.content
    # No role changed; the groups, which approval policies may name, are recorded.
    (synced,) = _events(AuditKind.ROLES_SYNCED)
    assert (synced["added"], synced["removed"]) == ({}, {})
    assert synced["groups_joined"] == ["london", "marketing"]


def test_the_groups_claim_is_the_one_configured(
    settings: Any, idp: IdentityProvider, tmp_path: Path, provider: Provider
) -> None:
    sso_on(settings, idp, tmp_path, groups_claim="roles")
    idp.directory.groups_claim("roles")
    idp.directory.person("ada", groups=["settle-viewers"])
    sso_sign_in(Client(), idp, "ada")
    assert _can(User.objects.get(socialaccount__provider="sso"), P.VIEW_OPERATIONS, provider)


def _refused_and_nothing_made(response: Any, code: str, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.content[:300]
    assert f'data-refusal="{code}"'.encode() in response.content
    assert User.objects.count() == 0 and SocialAccount.objects.count() == 0
    events = _events(AuditKind.SIGN_IN_REFUSED)
    assert [e["code"] for e in events] == [code]
    return events[0]


def test_a_forged_state_is_refused(sso: IdentityProvider) -> None:
    client = Client()
    sso_start(client)  # a sign-in under way: its state is not the one sent back
    response = client.get(f"{CALLBACK}?code=anything&state=forged-state")
    event = _refused_and_nothing_made(response, "sso_failed", 401)
    assert event["idp"] == "sso"
    assert not _signed_in(client)


def test_a_replayed_callback_is_refused(sso: IdentityProvider) -> None:
    sso.directory.person("ada", groups=["settle-viewers"])
    client = Client()
    back = urlsplit(sso.authorize(sso_start(client), "ada"))
    assert client.get(f"{back.path}?{back.query}").status_code == 302
    client.post("/logout/")
    replayed = client.get(f"{back.path}?{back.query}")
    assert replayed.status_code == 401
    assert b'data-refusal="sso_failed"' in replayed.content
    assert not _signed_in(client)
    assert len(_events(AuditKind.SIGNED_IN)) == 1


def test_an_id_token_with_another_nonce_is_refused(sso: IdentityProvider) -> None:
    sso.directory.person("ada", groups=["settle-viewers"])
    sso.directory.fault(nonce="wrong")
    event = _refused_and_nothing_made(sso_sign_in(Client(), sso, "ada"), "sso_nonce_mismatch", 401)
    assert event["subject"]  # who it claimed to be is on the record


def test_an_expired_id_token_is_refused(sso: IdentityProvider) -> None:
    sso.directory.person("ada", groups=["settle-viewers"])
    sso.directory.fault(expired=True)
    _refused_and_nothing_made(sso_sign_in(Client(), sso, "ada"), "sso_failed", 401)


def test_an_id_token_of_another_issuer_is_refused(sso: IdentityProvider) -> None:
    sso.directory.person("ada", groups=["settle-viewers"])
    sso.directory.fault(issuer="http://elsewhere.example")
    event = _refused_and_nothing_made(sso_sign_in(Client(), sso, "ada"), "sso_issuer_unknown", 401)
    assert event["issuer"] == "http://elsewhere.example"
    assert event["expected"] == sso.issuer


def test_an_e_mail_another_account_holds_is_refused_not_merged(sso: IdentityProvider) -> None:
    local = console_user("ada.local")
    local.email = "Ada@Example.com"
    local.save()
    sso.directory.person("ada", groups=["settle-viewers"], email="ada@example.com")
    client = Client()
    response = sso_sign_in(client, sso, "ada")
    assert response.status_code == 403
    assert b'data-refusal="sso_email_taken"' in response.content
    assert list(User.objects.values_list("username", flat=True)) == ["ada.local"]
    assert SocialAccount.objects.count() == 0
    assert not _signed_in(client)


def test_a_deactivated_directory_user_is_refused(sso: IdentityProvider) -> None:
    sso.directory.person("ada", groups=["settle-viewers"])
    sso_sign_in(Client(), sso, "ada")
    User.objects.filter(socialaccount__provider="sso").update(is_active=False)
    client = Client()
    response = sso_sign_in(client, sso, "ada")
    assert response.status_code == 403
    assert b'data-refusal="sso_account_inactive"' in response.content
    assert not _signed_in(client)


def test_with_single_sign_on_on_a_password_signs_in_a_superuser_alone(
    sso: IdentityProvider,
) -> None:
    console_user("olivia")
    User.objects.create_superuser("root", password=PASSWORD)
    client = Client()
    refused = client.post("/login/", {"login": "olivia", "password": PASSWORD})
    assert refused.status_code == 200 and not _signed_in(client)
    (failed,) = _events(AuditKind.SIGN_IN_FAILED)
    assert failed == {**failed, "username": "olivia", "reason": "password_sign_in_off"}

    before = BREAK_GLASS_SIGN_INS._value.get()
    assert client.post("/login/", {"login": "root", "password": PASSWORD}).status_code == 302
    (signed_in,) = _events(AuditKind.SIGNED_IN)
    assert signed_in["method"] == "password" and signed_in["break_glass"] is True
    assert BREAK_GLASS_SIGN_INS._value.get() == before + 1


def test_the_sign_in_page_offers_the_provider_and_hides_passwords_under_break_glass(
    sso: IdentityProvider,
) -> None:
    page = Client().get("/login/")
    assert b'data-sso="sso"' in page.content
    assert b"Sign in with the directory" in page.content
    assert b'<details class="break-glass"' in page.content


def test_a_page_once_signed_in_by_single_sign_on_costs_what_it_costs_a_password_user(
    sso: IdentityProvider, provider: Provider, settings: Any
) -> None:
    sso.directory.person("ada", groups=["settle-operators"])
    by_sso = Client()
    sso_sign_in(by_sso, sso, "ada")
    console_user("olivia", "operator", provider)
    settings.SETTLE_SSO_ENABLED = False  # a password signs in a non-superuser again
    by_password = Client()
    assert by_password.post("/login/", {"login": "olivia", "password": PASSWORD}).status_code == 302
    counted = []
    for client in (by_sso, by_password):
        client.get("/")
        with CaptureQueriesContext(connection) as queries:
            assert client.get("/").status_code == 200
        counted.append([q["sql"].split(" WHERE")[0] for q in queries])
    assert counted[0] == counted[1]  # roles are synced at sign-in, never on a page
