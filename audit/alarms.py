"""Alarms: what a checkpoint refused to sign, until a supervisor resolves it.

alarm
    An ``AuditAlarm`` of kind ``audit_broken``: a chain that no longer extends what a
    checkpoint signed, with the seq and reason the checkpoint found. Signed under the
    audit key like the checkpoint that raised it, which also names it in its own signed
    ``broken`` list, so an alarm cannot be made or removed with SQL access alone
    unnoticed (``verify_audit`` checks both ways).
checkpoint file alarm
    An ``AuditAlarm`` of kind ``checkpoint_file``: a checkpoint was signed in the
    database but its line could not be written to the checkpoint file (its storage was
    full or gone), so the file lacks it; the checkpoint task failed. Signed like the
    others; one open at a time. The next checkpoint that makes the file whole (writes
    the lines it lacks from the signed rows) resolves it itself, on the record, saying
    which lines it wrote.
open
    Not yet resolved. One open alarm per chain: a chain still broken at the next
    checkpoint is the same alarm. The console shows every open alarm to supervisors on
    every page.
resolved
    A supervisor saw it and said what was done (restored from a backup, reported), on
    the record: ``audit_alarm_resolved`` on the system chain
    (by a supervisor, in the console). Resolving changes no
    event; a chain still broken raises a new alarm when it next moves.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from audit.chain import audit_append, audit_transaction
from audit.hashing import ChainBreak, timestamp
from audit.kinds import AuditKind
from audit.models import AuditAlarm, AuditCheckpoint
from audit.seal import sign, signed_by_key
from common.actors import Actor
from common.canonical import canonical_dumps, sha256_digest

logger = logging.getLogger("settle.audit")


def alarm_digest(alarm: AuditAlarm) -> str:
    content: dict[str, Any] = {
        "kind": alarm.kind,
        "chain": alarm.chain,
        "seq": alarm.seq,
        "reason": alarm.reason,
        "checkpoint": alarm.checkpoint,
        "raised_at": timestamp(alarm.raised_at),
    }
    return sha256_digest(canonical_dumps(content))


def alarm_signed(alarm: AuditAlarm) -> bool:
    return signed_by_key(alarm_digest(alarm), alarm.signature)


def audit_alarms_raise(broken: Iterable[ChainBreak], *, checkpoint: AuditCheckpoint) -> None:
    """Raise an alarm for each broken chain that has none open; log every one at ERROR.

    Runs inside the checkpoint's transaction: the alarm and the signed checkpoint that
    names it are written together or not at all.
    """
    items = list(broken)
    if not items:
        return
    already = set(
        AuditAlarm.objects.filter(
            kind=AuditAlarm.Kind.AUDIT_BROKEN,
            chain__in=[item.chain for item in items],
            resolved_at__isnull=True,
        ).values_list("chain", flat=True)
    )
    for item in items:
        where = f"chain {item.chain!r}" if item.chain else "the system chain"
        logger.error(
            "audit_broken: checkpoint #%s did not sign %s, event #%s: %s",
            checkpoint.number,
            where,
            item.seq,
            item.reason,
        )
        if item.chain in already:
            continue
        alarm = AuditAlarm(
            kind=AuditAlarm.Kind.AUDIT_BROKEN,
            chain=item.chain,
            seq=item.seq,
            reason=item.reason,
            checkpoint=checkpoint.number,
            raised_at=checkpoint.made_at,
        )
        alarm.signature = sign(alarm_digest(alarm))
        alarm.save()
        already.add(item.chain)


# Who resolves a checkpoint file alarm: the checkpoint that made the file whole.
CHECKPOINT_SIGNER = Actor.system("audit_checkpoint")


def audit_file_alarm_raise(problem: str, *, checkpoint: int) -> AuditAlarm:
    """Open the ``checkpoint_file`` alarm (if none is), saying why; log it at ERROR."""
    logger.error(
        "checkpoint_file: checkpoint #%s is not in the checkpoint file: %s", checkpoint, problem
    )
    with audit_transaction():
        alarm = AuditAlarm.objects.filter(
            kind=AuditAlarm.Kind.CHECKPOINT_FILE, resolved_at__isnull=True
        ).first()
        if alarm is not None:
            return alarm
        alarm = AuditAlarm(
            kind=AuditAlarm.Kind.CHECKPOINT_FILE,
            chain="",
            seq=0,
            reason=problem,
            checkpoint=checkpoint,
            raised_at=timezone.now(),
        )
        alarm.signature = sign(alarm_digest(alarm))
        alarm.save()
    return alarm


def audit_alarm_resolved(alarm: AuditAlarm, *, actor: Actor, resolution: str) -> None:
    """Mark ``alarm`` resolved by ``actor``, on the system chain.

    The caller holds the alarm's row lock inside an ``audit_transaction`` and has
    decided that ``actor`` may resolve it.
    """
    alarm.resolved_at = timezone.now()
    alarm.resolved_by = actor
    alarm.resolution = resolution
    alarm.save(update_fields=["resolved_at", "resolved_by", "resolution"])
    audit_append(
        kind=AuditKind.AUDIT_ALARM_RESOLVED,
        actor=actor,
        data={
            "alarm": alarm.pk,
            "chain": alarm.chain,
            "seq": alarm.seq,
            "checkpoint": alarm.checkpoint,
            "resolution": resolution,
        },
    )


def audit_file_alarm_clear(*, repaired: list[int], checkpoint: int) -> AuditAlarm | None:
    """Resolve the open ``checkpoint_file`` alarm, the file being whole again; on the record."""
    if not AuditAlarm.objects.filter(
        kind=AuditAlarm.Kind.CHECKPOINT_FILE, resolved_at__isnull=True
    ).exists():
        return None
    if repaired:
        lines = f"#{repaired[0]}" if len(repaired) == 1 else f"#{repaired[0]}-#{repaired[-1]}"
        resolution = (
            f"repaired: the lines of checkpoint {lines} were written again from the signed "
            f"rows; the file is whole up to checkpoint #{checkpoint}"
        )
    else:
        resolution = f"the checkpoint file is written again; whole up to checkpoint #{checkpoint}"
    with audit_transaction():
        alarm = (
            AuditAlarm.objects.select_for_update()
            .filter(kind=AuditAlarm.Kind.CHECKPOINT_FILE, resolved_at__isnull=True)
            .first()
        )
        if alarm is None:
            return None
        audit_alarm_resolved(alarm, actor=CHECKPOINT_SIGNER, resolution=resolution)
    logger.warning("checkpoint_file alarm %s resolved: %s", alarm.pk, resolution)
    return alarm


def audit_alarms_open() -> QuerySet[AuditAlarm]:
    """Every open alarm, newest first."""
    return AuditAlarm.objects.filter(resolved_at__isnull=True).order_by("-raised_at", "-id")
