"""What changed in the operation core, handed to the apps that record it.

change
    One operation's change as the core sees it (``OperationChange``): the operation,
    already moved; the event that moved it (a transition's, or ``RECEIPT_COMPLETE``);
    the state it reached; the data the change carried.
recorder
    A function handed each batch of changes (``changes_record``) in the transaction that
    made them, registered once with ``changes_recorder_register`` (the webhooks' outbox
    registers in its app's ``ready``).

Why a registry: the core records what changed and its consumers decide what it means
to them, so the core imports none of them; and a recorder writes in the same
transaction as the change, so a rollback leaves nothing of either.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from recovery.models import Operation

# A stranded receipt completed as a recovery receipt (``receipt_complete``): the
# operation's state does not move, its dispatch's receipt does.
RECEIPT_COMPLETE = "receipt_complete"
# An approval addressed to a host's customer opened (``approval_opened``): the state does
# not move; the change carries the approval, its party, link and expiry.
APPROVAL_OPENED = "approval_opened"


@dataclass(frozen=True)
class OperationChange:
    """One change of ``operation`` (already applied to it), as its recorders see it."""

    operation: Operation
    event: str
    target: str
    data: dict[str, Any]


ChangesRecorder = Callable[[Sequence[OperationChange]], object]

_recorders: list[ChangesRecorder] = []


def changes_recorder_register(recorder: ChangesRecorder) -> None:
    """Hand every later batch of changes to ``recorder`` too; once, however often called."""
    if recorder not in _recorders:
        _recorders.append(recorder)


def changes_record(changes: Sequence[OperationChange]) -> None:
    """Hand ``changes`` to every registered recorder, in the caller's transaction."""
    if not changes:
        return
    for recorder in _recorders:
        recorder(changes)
