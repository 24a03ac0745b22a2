"""Every sign-in, sign-out, failure and refusal, on the audit log's system chain.

Django sends the sign-in signals for every way in (the console's form, the admin's, single
sign-on, a passkey); the receivers here turn each into one audit event and a counter.
A signed-in person's roles from the directory are synced in the same transaction as
their sign-in event (``identity.roles``).

Failures and refusals come from people who are not signed in: to keep one address from
filling the log, each address has its first ``SETTLE_REFUSALS_RECORDED_PER_MINUTE``
recorded a minute; the rest are logged and counted (``settle_sign_ins_total``) only.
"""

from __future__ import annotations

import logging
from typing import Any

from allauth.account.authentication import get_authentication_records
from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.dispatch import receiver
from django.http import HttpRequest
from django.utils import timezone

from audit.chain import audit_append, audit_transaction
from audit.kinds import AuditKind
from audit.refusals import refusal_append
from common.actors import Actor
from common.errors import ErrorCode
from common.windows import CounterUnavailable, Window, window_count
from identity.audited import user_named
from identity.metrics import BREAK_GLASS_SIGN_INS, SIGN_INS
from identity.oidc import SsoClaims
from identity.roles import roles_sync
from identity.throttle import client_address, username_of

log = logging.getLogger(__name__)

SIGN_IN = Actor.system("sign-in")
# The session keeps the directory's word of the signed-in person: the console says from
# it why someone has no role, without a query.
SSO_SESSION_KEY = "settle_sso"
SSO_PENDING_SESSION_KEY = "settle_sso_pending"


def _sso_claims(request: HttpRequest, user: AbstractBaseUser) -> SsoClaims | None:
    """The directory's claims of this sign-in, if single sign-on made it.

    On the request at the callback; in the session when allauth asked for the person's
    passkey first (its second step for single sign-on too) and the sign-in ends on that
    step's request. Kept claims count only if allauth's record of this user's sign-in
    has the same subject: claims of an abandoned sign-in never name a later one.
    """
    pending = request.session.pop(SSO_PENDING_SESSION_KEY, None)
    claims: SsoClaims | None = getattr(request, "settle_sso", None)
    if claims is not None or not isinstance(pending, dict):
        return claims
    kept = SsoClaims(**pending)
    records = get_authentication_records(request, user)
    if any(r.get("method") == "socialaccount" and r.get("uid") == kept.subject for r in records):
        return kept
    return None


def _method(request: HttpRequest, sso: SsoClaims | None) -> str:
    """How this sign-in was made: sso, passkey or password (allauth's record of it)."""
    if sso is not None:
        return "sso"
    records = request.session.get("account_authentication_methods", []) if request else []
    # A passkey alone is allauth's "mfa" record marked passwordless; a passkey asked
    # after a password is a second record, and the sign-in is still the password's.
    if any(
        isinstance(r, dict) and r.get("method") == "mfa" and r.get("passwordless") for r in records
    ):
        return "passkey"
    return "password"


@receiver(user_logged_in, dispatch_uid="settle-signed-in")
@audit_transaction()
def signed_in(sender: Any, request: HttpRequest | None, user: AbstractBaseUser, **_: Any) -> None:
    if request is None or "REMOTE_ADDR" not in request.META:
        # A login with no HTTP request behind it (Client.force_login, whose request has
        # only what login() itself put in META): nobody signed in.
        return
    sso = _sso_claims(request, user)
    method = _method(request, sso)
    data: dict[str, Any] = {
        **user_named(user),
        "method": method,
        "address": client_address(request),
    }
    if sso is not None:
        data.update(idp=sso.idp, subject=sso.subject, groups=sso.groups)
        request.session[SSO_SESSION_KEY] = {"idp": sso.idp, "groups": sso.groups}
        roles_sync(
            user=user,
            idp=sso.idp,
            subject=sso.subject,
            groups=sso.groups,
            actor=Actor.system(f"sso-{sso.idp}"),
        )
    if method == "password" and settings.SETTLE_SSO_ENABLED:
        data["break_glass"] = True
        BREAK_GLASS_SIGN_INS.inc()
        log.warning("break-glass password sign-in of superuser %s", user.get_username())
    SIGN_INS.labels(method, "signed_in").inc()
    audit_append(kind=AuditKind.SIGNED_IN, actor=Actor.of("user", user), data=data)


@receiver(user_logged_out, dispatch_uid="settle-signed-out")
@audit_transaction()
def signed_out(
    sender: Any, request: HttpRequest | None, user: AbstractBaseUser | None, **_: Any
) -> None:
    if user is None or request is None:
        return
    audit_append(
        kind=AuditKind.SIGNED_OUT,
        actor=Actor.of("user", user),
        data={
            **user_named(user),
            "address": client_address(request),
            # Why, when Settle signed them out (identity.sessions: "idle", "max_age").
            **_signed_out_reason(request),
        },
    )


def _signed_out_reason(request: HttpRequest) -> dict[str, str]:
    reason = getattr(request, "settle_signed_out_reason", None)
    return {"reason": reason} if reason else {}


def _recordable(request: HttpRequest, kind: str, data: dict[str, Any]) -> bool:
    """Whether this address may still put a failure on the log in this minute."""
    window = Window.at(timezone.now(), settings.SETTLE_REFUSAL_WINDOW_SECONDS)
    try:
        count = window_count(name=f"identity:failures:{client_address(request)}", window=window)
    except CounterUnavailable:  # no counter: every failure goes on the record
        log.exception("sign-in failure counter unavailable")
        return True
    if count <= settings.SETTLE_REFUSALS_RECORDED_PER_MINUTE:
        return True
    log.warning("%s not recorded (this address's limit a minute): %s", kind, data)
    return False


@receiver(user_login_failed, dispatch_uid="settle-sign-in-failed")
@audit_transaction()
def sign_in_failed(
    sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **_: Any
) -> None:
    if request is None:
        return
    if getattr(request, "axes_locked_out", False):
        reason = "locked_out"
    elif getattr(request, "settle_password_off", False):
        reason = "password_sign_in_off"  # single sign-on is on and this is no superuser
    else:
        reason = "wrong_credentials"
    SIGN_INS.labels("password", "failed").inc()
    data = {
        "username": username_of(request, credentials) or "",
        "reason": reason,
        "address": client_address(request),
    }
    if _recordable(request, AuditKind.SIGN_IN_FAILED, data):
        audit_append(kind=AuditKind.SIGN_IN_FAILED, actor=SIGN_IN, data=data)


@audit_transaction()
def sign_in_refused(
    request: HttpRequest, code: ErrorCode, claims: SsoClaims | None, **detail: Any
) -> None:
    """A single sign-on the identity provider allowed and Settle refused, or could not verify."""
    SIGN_INS.labels("sso", "refused").inc()
    data: dict[str, Any] = {**detail, "address": client_address(request)}
    if claims is not None:
        data.update(
            idp=claims.idp,
            subject=claims.subject,
            issuer=claims.issuer,
            email=claims.email,
            groups=claims.groups,
        )
    if _recordable(request, AuditKind.SIGN_IN_REFUSED, data):
        refusal_append(kind=AuditKind.SIGN_IN_REFUSED, code=code, actor=SIGN_IN, data=data)


@audit_transaction()
def passkey_hold_refused(request: HttpRequest, user: AbstractBaseUser, held_for: list[str]) -> None:
    """A held session refused (``passkey_required``): an API call made with it, or a form
    it posted; a page it asked for is only sent to the page that says why."""
    data: dict[str, Any] = {
        **user_named(user),
        "held_for": held_for,  # the roles SETTLE_REQUIRE_PASSKEY_FOR names
        "method": request.method or "",
        # As asked, short of what a database's text cannot hold.
        "path": request.path.replace("\x00", "")[:200],
        "address": client_address(request),
    }
    if _recordable(request, AuditKind.PASSKEY_HOLD_REFUSED, data):
        refusal_append(
            kind=AuditKind.PASSKEY_HOLD_REFUSED,
            code=ErrorCode.PASSKEY_REQUIRED,
            actor=Actor.of("user", user),
            data=data,
        )
