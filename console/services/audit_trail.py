"""What people do with the audit log itself: export it, resolve its alarms.

An export hands a copy of the record to someone; who took which part of it, and in
which form, belongs on the record too (``audit_exported``, on the system chain). So does
a supervisor's word on an alarm a checkpoint raised (``audit_alarm_resolved``).
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from audit.alarms import audit_alarm_resolved
from audit.chain import audit_append, audit_transaction
from audit.kinds import AuditKind
from audit.models import AuditAlarm
from common.actors import Actor
from common.errors import ErrorCode
from recovery.selectors.access import audit_alarms_for_user, supervises_any_provider
from recovery.services.access import actor_user
from recovery.services.errors import Forbidden, Invalid, NotFound

logger = logging.getLogger("settle.audit")

RESOLUTION_MAX = 2000

ExportFormat = Literal["csv", "jsonl"]


def audit_export_record(
    *, filters: dict[str, Any], export_format: ExportFormat, actor: Actor
) -> None:
    """Record that ``actor`` exported the trail narrowed by ``filters``, before it streams.

    Its own transaction, committed before the first row is sent: an export that fails
    halfway was still asked for, and no open transaction is held for the whole stream.
    """
    with audit_transaction():
        audit_append(
            kind=AuditKind.AUDIT_EXPORTED,
            actor=actor,
            data={"format": export_format, "filters": filters},
        )


def audit_alarm_resolve(*, actor: Actor, alarm_id: int, resolution: str) -> AuditAlarm:
    """Mark an open alarm resolved by a supervisor, saying what was done; on the record.

    Only a supervisor (``supervises_any_provider``) may, and only an alarm they may see
    (``audit_alarms_for_user``: their providers' chains and the system chain); another
    provider's is not found. Resolving changes no event; a chain still broken raises a
    new alarm when it next moves.
    """
    user = actor_user(actor)
    if user is None or not supervises_any_provider(user=user):
        raise Forbidden("only a supervisor may resolve audit alarms")
    resolution = resolution.strip()
    if not resolution:
        raise Invalid(ErrorCode.RESOLUTION_REQUIRED, "say what was done about it")
    if len(resolution) > RESOLUTION_MAX:
        raise Invalid(ErrorCode.RESOLUTION_TOO_LONG, f"at most {RESOLUTION_MAX} characters")
    with audit_transaction():
        alarm = (
            audit_alarms_for_user(user=user)
            .select_for_update(of=("self",))
            .filter(pk=alarm_id)
            .first()
        )
        if alarm is None:
            raise NotFound(ErrorCode.UNKNOWN_ALARM, f"no alarm {alarm_id}")
        if alarm.resolved_at is not None:
            raise Invalid(ErrorCode.ALREADY_RESOLVED, f"alarm {alarm_id} was resolved already")
        audit_alarm_resolved(alarm, actor=actor, resolution=resolution)
    logger.warning("audit alarm %s (%r) resolved by %s", alarm.pk, alarm.chain, actor)
    return alarm
