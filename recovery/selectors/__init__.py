"""Reads that start from the caller: a host, an approver or a console user.

Each ``*_for_*`` selector returns only what that caller may see; views, services and the
console start every query from one of them, so a check cannot be forgotten in one place.
One module per concern; callers import a name from the module that defines it:

- ``access``: who may see what — the providers, operations and approvals a host, an
  approver or a console user may read, and who supervises the audit trail;
- ``records``: the API objects built from rows (approval, permit, evidence, operation);
- ``queue``: the console's queue — filters, pages, counts;
- ``jump``: the one operation a key, an id or a provider's reference names;
- ``operation_page``: one operation's timeline, permit history, lookup in flight, and
  what differs between intended action, evidence and receipt;
- ``reconciliations``: the four-eyes proposals waiting for a second operator;
"""
