"""Reading the audit log out of Settle: every export is itself an audit event.

An export hands a copy of the record to someone; who took which part of it, and in
which form, belongs on the record too (``audit_exported``, on the system chain).
"""

from __future__ import annotations

from typing import Any, Literal

from approvals.actors import Actor
from recovery.audit import audit_append, audit_transaction

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
            kind="audit_exported",
            actor=actor,
            data={"format": export_format, "filters": filters},
        )
