"""A decision signed with a passkey, as the deciding services take it.

The signature itself is checked before a service is called (``identity.passkey_signing``,
against the person's current passkeys and the statement the console kept); what every
deciding service checks again is that the statement is *its* decision, and that a
decision the policy wants signed is (``common.statements`` names the kinds).
"""

from __future__ import annotations

from typing import Any

from common import statements
from common.actors import Actor
from common.errors import ErrorCode
from recovery.services.errors import RecoveryError


def signed_decision_check(
    signature: dict[str, Any] | None,
    *,
    required: bool,
    kind: str,
    decision: str,
    actor: Actor,
    **subject: object,
) -> None:
    """Refuse an unsigned decision where one is ``required`` (``passkey_required``), or a
    signature whose statement is not ``actor``'s ``decision`` of ``kind`` on ``subject``
    (``signature_invalid``)."""
    if not signature:
        if required:
            raise RecoveryError(
                ErrorCode.PASSKEY_REQUIRED, "this decision must be signed with a passkey"
            )
        return
    if not statements.statement_matches(
        signature, kind, decision=decision, person=actor.stored, **subject
    ):
        raise RecoveryError(
            ErrorCode.SIGNATURE_INVALID, "the signed statement is not this decision"
        )
