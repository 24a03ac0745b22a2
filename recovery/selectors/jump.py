"""The console's jump box: the one operation a key, a permit or approval id, or a
provider's reference names, among those the user may view."""

from __future__ import annotations

import uuid
from typing import Any

from approvals.models import Approval, Permit
from recovery.models import Evidence, Operation
from recovery.selectors.access import providers_visible_to


def operation_jump_for_user(*, user: Any, text: str) -> str | None:
    """The key of the one operation ``text`` names exactly, among those ``user`` may view.

    Names: the operation's key, its permit's or approval's id, or a provider reference
    (the evidence's or the receipt's) that belongs to exactly one visible operation —
    a reference two operations share names neither. Hidden operations are never named,
    so a jump cannot tell an outsider that an id exists.
    """
    if not text or "\x00" in text or len(text) > 200:
        return None
    visible = Operation.objects.filter(provider__in=providers_visible_to(user=user))
    if visible.filter(key=text).exists():
        return text
    try:
        ident = uuid.UUID(text)
    except ValueError:
        ident = None
    if ident is not None:
        bound = [
            *Permit.objects.filter(pk=ident).values_list("operation_key", flat=True),
            *Approval.objects.filter(pk=ident).values_list("operation_key", flat=True),
        ]
        for key in bound:
            if visible.filter(key=key).exists():
                return str(key)
        return None
    # Two reads, each along its partial index (``evidence_provider_reference``,
    # ``receipt_reference``): one OR across them would read every operation.
    by_evidence = visible.filter(
        pk__in=Evidence.objects.filter(provider_reference=text).values("operation")
    )
    by_receipt = visible.filter(dispatch__receipt_reference=text)
    named = {
        *by_evidence.values_list("key", flat=True)[:2],
        *by_receipt.values_list("key", flat=True)[:2],
    }
    return named.pop() if len(named) == 1 else None
