"""Passkeys: their audit events, and the console and API held until a person has used one.

allauth.mfa does the WebAuthn ceremonies (fido2 underneath) and keeps each passkey as an
``Authenticator`` with its registration response. Here Settle records every passkey
added or removed on the system chain, with the public key that a later signed decision
is checked against, even after the passkey itself is gone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from allauth.account.authentication import get_authentication_records
from allauth.mfa.models import Authenticator
from allauth.mfa.signals import authenticator_added, authenticator_removed
from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db.models.signals import pre_delete
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from fido2 import cbor
from fido2.utils import websafe_encode
from fido2.webauthn import RegistrationResponse

from audit.chain import audit_append, audit_transaction
from audit.kinds import AuditKind
from common.actors import Actor
from common.errors import ErrorCode
from identity.audited import user_named
from identity.events import passkey_hold_refused
from recovery.api import carries_token, error_response
from recovery.selectors.access import user_roles


def _passkey_data(user: AbstractBaseUser, authenticator: Authenticator) -> dict[str, Any]:
    return {
        **user_named(user),
        "authenticator_id": authenticator.pk or getattr(authenticator, "_settle_id", None),
        "name": authenticator.data.get("name", ""),
    }


def passkey_credential(authenticator: Authenticator) -> dict[str, str]:
    """The credential id and COSE public key (base64url) of a passkey's registration."""
    # fido2's own parser, as the verification of signed decisions will use it.
    response = RegistrationResponse.from_dict(authenticator.data["credential"])
    credential = response.response.attestation_object.auth_data.credential_data
    assert credential is not None  # a registration always carries its credential
    return {
        "credential_id": websafe_encode(credential.credential_id),
        "public_key": websafe_encode(cbor.encode(dict(credential.public_key))),
    }


@receiver(authenticator_added, dispatch_uid="settle-passkey-added")
@audit_transaction()
def passkey_added(
    sender: Any,
    request: HttpRequest,
    user: AbstractBaseUser,
    authenticator: Authenticator,
    **_: Any,
) -> None:
    if authenticator.type != Authenticator.Type.WEBAUTHN:
        return
    audit_append(
        kind=AuditKind.PASSKEY_ADDED,
        actor=Actor.of("user", user),
        data={**_passkey_data(user, authenticator), **passkey_credential(authenticator)},
    )


@receiver(pre_delete, sender=Authenticator, dispatch_uid="settle-passkey-deleting")
def _passkey_deleting(sender: Any, instance: Authenticator, **_: Any) -> None:
    # allauth deletes the row before it sends authenticator_removed, and Django clears
    # the primary key on delete: the event names the passkey by the id kept here.
    instance._settle_id = instance.pk


@receiver(authenticator_removed, dispatch_uid="settle-passkey-removed")
@audit_transaction()
def passkey_removed(
    sender: Any,
    request: HttpRequest,
    user: AbstractBaseUser,
    authenticator: Authenticator,
    **_: Any,
) -> None:
    if authenticator.type != Authenticator.Type.WEBAUTHN:
        return
    # The passkey's owner, whoever removed it (allauth sends the one signed in).
    owner = authenticator.user
    audit_append(
        kind=AuditKind.PASSKEY_REMOVED,
        actor=Actor.of("user", user),
        data={
            **_passkey_data(owner, authenticator),
            "credential_id": passkey_credential(authenticator)["credential_id"],
        },
    )


def passkey_used(request: HttpRequest, user: AbstractBaseUser) -> bool:
    """Whether ``user`` proved a passkey in this session: to sign in, as the second
    factor of a password or single sign-on, or to confirm it is still them."""
    return any(
        record.get("method") == "mfa" and record.get("type") == Authenticator.Type.WEBAUTHN
        for record in get_authentication_records(request, user)
    )


# What makes someone each role SETTLE_REQUIRE_PASSKEY_FOR names (``UserRoles``): a
# supervisor as the navigation knows one, an approver as anyone who may decide an
# approval. Superusers are both.
_ROLE_HELD = {"supervisor": "supervises", "approver": "decides"}


class PasskeyRequiredMiddleware:
    """With ``SETTLE_REQUIRE_PASSKEY_FOR`` naming roles (``supervisor``, ``approver``), a
    person in one of them who has not used a passkey in this session is held: a page is
    sent to the one that says why, and the host API answers 403 ``passkey_required`` to
    anything the session asks of it. Only the passkey pages, sign-in, sign-out, static
    files and the API's document stay open.

    The API is held too because its approval endpoints accept a console session (with
    its CSRF token). A request that carries an ``Authorization`` header is not the
    session's: the API authenticates it by that token alone, never by the cookie.

    Asked on every request rather than once at sign-in: a role granted while a session
    is open applies from its next request, as every other role change does. The passkey
    mark is allauth's own record of the session's sign-in steps (no query); only a
    signed-in user without it costs one statement, the one the navigation asks anyway
    (``user_roles``), whose answer is left on the request for it.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not (settings.SETTLE_REQUIRE_PASSKEY_FOR and self._held(request)):
            return self.get_response(request)
        user = request.user
        assert user.is_authenticated  # only a signed-in person is held
        api = request.path_info.startswith("/api/")
        if api or request.method not in ("GET", "HEAD", "OPTIONS"):
            # Tried to act (or to read through the API): on the record, as refusals are.
            passkey_hold_refused(request, user, list(settings.SETTLE_REQUIRE_PASSKEY_FOR))
        if api:
            return error_response(
                ErrorCode.PASSKEY_REQUIRED,
                "use a passkey in this session first (the console asks for it)",
            )
        url = reverse("passkey-required")
        if getattr(request, "htmx", False):
            held = HttpResponse(status=403)
            held["HX-Redirect"] = url
            return held
        return HttpResponseRedirect(url)

    def _held(self, request: HttpRequest) -> bool:
        if request.path_info.startswith(_exempt_paths()):
            return False
        if request.path_info.startswith("/api/") and carries_token(request):
            return False  # a token's request, not the session's
        user = request.user
        if not user.is_authenticated or passkey_used(request, user):
            return False
        roles = user_roles(user=user)
        # The navigation's answer too (``console.context_processors``): asked once.
        request._settle_roles = roles  # type: ignore[attr-defined]
        return any(getattr(roles, _ROLE_HELD[role]) for role in settings.SETTLE_REQUIRE_PASSKEY_FOR)


def _exempt_paths() -> tuple[str, ...]:
    """What a held person may still reach: enough to register a passkey, prove it, or
    leave; and the API's document, which is public."""
    return (
        "/" + settings.STATIC_URL.lstrip("/"),
        reverse("passkey-required"),
        reverse("mfa_index"),  # registering, listing, proving: /accounts/2fa/
        reverse("account_reauthenticate"),
        reverse("login"),
        reverse("logout"),
        reverse("account_logout"),
        reverse("openapi"),
    )
