"""The append-only audit log: one hash chain per operation, signed checkpoints, alarms.

- ``chain``: hashing and appending events, in the transaction of the change they describe;
- ``checkpoints``: signing the chains' new heads, each an extension of what was signed;
- ``alarms``: the chains a checkpoint refused to sign, until a supervisor resolves them;
- ``verify``: checking the whole log, every chain against every checkpoint.

The names below are the ones the rest of Settle uses; each lives in the module named.
"""

from __future__ import annotations

from recovery.audit.alarms import audit_alarms_open, audit_alarms_open_newest
from recovery.audit.chain import (
    GENESIS_HASH,
    SYSTEM_CHAIN,
    ChainBreak,
    audit_append,
    audit_chain_locked,
    audit_head_fields,
    audit_head_new,
    audit_head_saved,
    audit_head_write,
    audit_retract,
    audit_retract_many,
    audit_tagged,
    audit_transaction,
    event_digest,
    event_export,
    event_hash,
    exported_event_hash,
)
from recovery.audit.checkpoints import audit_checkpoint
from recovery.audit.verify import (
    AuditStatus,
    VerifyTally,
    audit_checkpoint_newest,
    audit_status,
    audit_verification_run,
    audit_verify,
)

__all__ = [
    "GENESIS_HASH",
    "SYSTEM_CHAIN",
    "AuditStatus",
    "ChainBreak",
    "VerifyTally",
    "audit_alarms_open",
    "audit_alarms_open_newest",
    "audit_append",
    "audit_chain_locked",
    "audit_checkpoint",
    "audit_checkpoint_newest",
    "audit_head_fields",
    "audit_head_new",
    "audit_head_saved",
    "audit_head_write",
    "audit_retract",
    "audit_retract_many",
    "audit_status",
    "audit_tagged",
    "audit_transaction",
    "audit_verification_run",
    "audit_verify",
    "event_digest",
    "event_export",
    "event_hash",
    "exported_event_hash",
]
