"""Who a supervisor may see on the people page, with what the page shows of each; whether
a person holds a passkey to sign with."""

from __future__ import annotations

from typing import Any

from allauth.mfa.models import Authenticator
from allauth.socialaccount.models import SocialAccount
from allauth.usersessions.models import UserSession
from django.contrib.auth.models import User
from django.contrib.contenttypes.models import ContentType
from django.contrib.sessions.models import Session
from django.db.models import Count, Exists, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone
from guardian.models import UserObjectPermission

from recovery.models import Provider
from recovery.selectors.access import providers_supervised


def people_for_user(*, user: Any) -> QuerySet[User]:
    """The console users ``user`` may see and whose sessions they may end, by username.

    A superuser's are everyone; another supervisor's those holding a role on a provider
    they supervise, superusers excepted. Nobody else's. Each comes annotated
    (``live_sessions``, ``has_passkeys``, ``from_directory``): one statement however many.
    """
    people = User.objects.order_by("username")
    if not user.is_authenticated or not user.is_active:
        return people.none()
    if not user.is_superuser:
        supervised = [
            str(pk) for pk in providers_supervised(user=user).values_list("pk", flat=True)
        ]
        holders = UserObjectPermission.objects.filter(
            content_type=ContentType.objects.get_for_model(Provider), object_pk__in=supervised
        )
        people = people.filter(is_superuser=False, pk__in=holders.values("user_id"))
    # Open: its session still stored and not expired (one idle too long counts until
    # its next request signs it out).
    stored = Session.objects.filter(
        session_key=OuterRef("session_key"), expire_date__gt=timezone.now()
    )
    live = (
        UserSession.objects.filter(user=OuterRef("pk"))
        .filter(Exists(stored))
        .order_by()
        .values("user")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return people.annotate(
        live_sessions=Coalesce(Subquery(live), 0),
        has_passkeys=Exists(
            Authenticator.objects.filter(user=OuterRef("pk"), type=Authenticator.Type.WEBAUTHN)
        ),
        from_directory=Exists(SocialAccount.objects.filter(user=OuterRef("pk"))),
    )


def passkey_held(*, user: Any) -> bool:
    """Whether ``user`` has registered a passkey (and so may sign a decision)."""
    held = Authenticator.objects.filter(user_id=user.pk, type=Authenticator.Type.WEBAUTHN)
    return bool(held.exists())
