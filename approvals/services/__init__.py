"""Approvals and permits: decide, consume (exactly once), revoke; one module per concern.

Callers own the transaction: these functions are called from inside the caller's
``transaction.atomic`` block so the permit change, the caller's own rows and its audit
event commit together.

- ``errors``: what a refused approval, approver or permit raises, with its code;
- ``approvers``: approver credentials and their tokens;
- ``approvals``: requesting, deciding, voting on and expiring an approval;
- ``permits``: consuming, refusing and revoking a permit;
- ``parties``: a host's customers, their passkey enrolment links and passkeys.

Callers import from the module that defines a name; nothing is re-exported here.
"""
