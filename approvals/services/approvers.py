"""Approver credentials: created with a token shown once, found by its hash, scoped."""

from __future__ import annotations

from typing import TypeVar

from django.db import models

from approvals.models import (
    Approver,
)
from approvals.services.errors import ApprovalError
from common.actors import Actor
from common.credentials import token_new
from common.errors import ErrorCode
from dbsql.rows import select_first

M = TypeVar("M", bound=models.Model)


def approver_create(
    *,
    name: str,
    providers: list[str] | None = None,
    hosts: list[str] | None = None,
    all_providers: bool = False,
) -> tuple[Approver, str]:
    """Create an approver credential; the token is returned once and stored hashed.

    Its scope is at least one provider, or ``all_providers``, said explicitly.
    """
    if not (providers or all_providers):
        raise ApprovalError(ErrorCode.EMPTY_SCOPE, "an approver needs a provider, or all providers")
    token, hashed = token_new("approver")
    approver = Approver.objects.create(
        name=name,
        token_hash=hashed,
        all_providers=all_providers,
        providers=sorted(set(providers or [])),
        hosts=sorted(set(hosts or [])),
    )
    return approver, token


def approver_for(*, actor: Actor) -> Approver | None:
    """The active approver credential ``actor`` names; None for any other actor."""
    if actor.kind != "approver" or not actor.id.isdigit():
        return None
    return Approver.objects.filter(pk=int(actor.id), disabled_at=None).first()


def credential_by_hash(model: type[M], hashed: str) -> M | None:
    """The active credential row of ``model`` whose token hashes to ``hashed``, or None.

    Written out (``dbsql.rows``) rather than built by the ORM: it is the first statement of
    every API call, and building it cost several times what running it does.
    """
    return select_first(model, token_hash=hashed, disabled_at=None)
