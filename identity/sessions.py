"""Sessions that end: at most ``SETTLE_SESSION_MAX_AGE_MINUTES`` after sign-in, after
``SETTLE_SESSION_IDLE_MINUTES`` without a request, when a supervisor ends them, and at
once when their user is deactivated.

The expiry is set once, at sign-in, to an instant: a request never slides it. Activity
is kept in the session and written at most once a minute, so a page adds no statement
most of the time (a session write is an UPDATE). allauth.usersessions keeps a row for
each session, written at sign-in only, by which a user's sessions are found to end them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.contrib.auth import SESSION_KEY, logout
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import User
from django.contrib.auth.signals import user_logged_in
from django.db.models.signals import post_save, pre_save
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse

from audit.chain import audit_append, audit_transaction
from audit.kinds import AuditKind
from common.actors import Actor
from identity.audited import user_named
from identity.throttle import client_address

log = logging.getLogger(__name__)

# Seconds since the epoch, in the session: when it signed in, and its last recorded request.
SIGNED_IN_AT = "settle_signed_in_at"
SEEN_AT = "settle_seen_at"
# How stale the recorded activity may grow before a request writes it again: the idle
# timeout is this much less exact, and a busy session is written once a minute at most.
ACTIVITY_WRITE_SECONDS = 60
DEACTIVATION = Actor.system("deactivation")


def session_expiry_set(request: HttpRequest) -> None:
    """Fix the session's end at its sign-in time plus the maximum age.

    An instant, not a number of seconds: Django counts seconds from the last write, which
    the activity write would move on every minute.
    """
    signed_in = request.session.setdefault(SIGNED_IN_AT, int(time.time()))
    ends = datetime.fromtimestamp(signed_in + settings.SESSION_COOKIE_AGE, tz=UTC)
    request.session.set_expiry(ends)


@receiver(user_logged_in, dispatch_uid="settle-session-started")
def session_started(
    sender: Any, request: HttpRequest | None, user: AbstractBaseUser, **_: Any
) -> None:
    """Every way in (the console's form, the admin's, single sign-on, a passkey)."""
    if request is None or not hasattr(request, "session"):
        return
    now = int(time.time())
    request.session[SIGNED_IN_AT] = now
    request.session[SEEN_AT] = now
    session_expiry_set(request)
    from allauth.usersessions.models import UserSession  # see sessions_end

    if client_address(request):  # not Client.force_login's request, from nowhere
        # allauth records its own sign-ins (its user_logged_in); the admin's form is not
        # one of them, and a session without its row could not be ended.
        UserSession.objects.create_from_request(request, user=user)


def session_sign_out(request: HttpRequest, reason: str) -> None:
    """Sign the request's user out; the audit event (``identity.events``) says why."""
    request.settle_signed_out_reason = reason  # type: ignore[attr-defined]
    logout(request)


class IdleSignOutMiddleware:
    """Sign out a session idle longer than ``SETTLE_SESSION_IDLE_MINUTES``, and record
    its activity, at most once a minute.

    Reads the session alone, which the page reads anyway: no statement of its own but
    the minute's write, and a sign-out's.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if SESSION_KEY in request.session:
            self._check(request)
        return self.get_response(request)

    def _check(self, request: HttpRequest) -> None:
        session = request.session
        now = time.time()
        signed_in = session.get(SIGNED_IN_AT)
        seen = session.get(SEEN_AT)
        if signed_in is not None and now - signed_in >= settings.SESSION_COOKIE_AGE:
            session_sign_out(request, "max_age")
        elif seen is not None and now - seen >= settings.SETTLE_SESSION_IDLE_MINUTES * 60:
            session_sign_out(request, "idle")
        elif seen is None or now - seen >= ACTIVITY_WRITE_SECONDS:
            # A session from before these stamps (or Client.force_login) starts its count now.
            session.setdefault(SIGNED_IN_AT, int(now))
            session[SEEN_AT] = int(now)


@audit_transaction()
def sessions_end(*, user: AbstractBaseUser, actor: Actor, reason: str) -> int:
    """End every open session of ``user``; how many were open.

    The sessions allauth.usersessions knows of: every sign-in since it was installed.
    """
    # Imported here: this module is imported as the apps load (identity.apps), and
    # allauth refuses its models' import before then.
    from allauth.usersessions.models import UserSession

    # Not allauth's purge_and_list: it drops an inactive user's sessions as dead, and
    # leaves them stored. Each is ended; those still stored are counted.
    sessions = list(UserSession.objects.filter(user_id=user.pk))
    stored = [session for session in sessions if session.exists()]
    for session in sessions:
        session.end()
    audit_append(
        kind=AuditKind.SESSIONS_ENDED,
        actor=actor,
        data={
            **user_named(user),
            "sessions": len(stored),
            "reason": reason,
        },
    )
    log.info("ended %d sessions of %s: %s", len(stored), user.get_username(), reason)
    return len(stored)


def user_deactivate(*, user: User, actor: Actor) -> None:
    """Deactivate ``user``; their sessions end with it (``_deactivated``), by ``actor``."""
    user.is_active = False
    user._settle_deactivated_by = actor  # type: ignore[attr-defined]
    user.save(update_fields=["is_active"])


# A user's deactivation ends their sessions however it is made (the admin, the people
# page, a script's save()); a queryset's update() sends no signal, and there the
# authentication middleware's refusal of an inactive user still holds.
@receiver(pre_save, sender=settings.AUTH_USER_MODEL, dispatch_uid="settle-was-active")
def _was_active(sender: Any, instance: Any, update_fields: Any = None, **_: Any) -> None:
    # Asked only when the save deactivates: a sign-in's save of last_login costs nothing.
    instance._settle_deactivating = (
        not instance.is_active
        and instance.pk is not None
        and (update_fields is None or "is_active" in update_fields)
        and sender.objects.filter(pk=instance.pk, is_active=True).exists()
    )


@receiver(post_save, sender=settings.AUTH_USER_MODEL, dispatch_uid="settle-deactivated")
def _deactivated(sender: Any, instance: Any, **_: Any) -> None:
    if not getattr(instance, "_settle_deactivating", False):
        return
    instance._settle_deactivating = False
    actor = getattr(instance, "_settle_deactivated_by", DEACTIVATION)
    sessions_end(user=instance, actor=actor, reason="deactivated")


def sessions_expired_clear() -> tuple[int, int]:
    """Expired sessions out of the session table, and allauth's rows of sessions gone.

    Django keeps an expired session's row until ``clearsessions`` runs, and allauth
    checks each of a person's session rows at their every sign-in: beat clears both, so
    that neither grows with the sessions a person ever had. Returns (sessions, rows).
    """
    from allauth.usersessions.models import UserSession  # see sessions_end
    from django.contrib.sessions.models import Session

    expired, _ = Session.objects.filter(expire_date__lt=datetime.now(UTC)).delete()
    gone, _ = UserSession.objects.exclude(
        session_key__in=Session.objects.values("session_key")
    ).delete()
    return expired, gone
