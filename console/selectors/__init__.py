"""The console's own reads, one module per area; none re-exported here.

Each starts from the recovery core's selectors (``recovery.selectors``), so that what a
console user sees is limited as everywhere else.

- ``dashboard``: the supervisor dashboard's figures, from what its refresh keeps;
- ``audit_trail``: the audit trail's filters, pages, export and health.
"""
