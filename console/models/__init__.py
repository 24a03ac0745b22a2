"""The console's own rows, one module per area, every model re-exported here.

- ``dashboard``: the supervisor dashboard's rollup, its refresh state, what is stuck;
- ``exports``: operators' exports of the audit trail.
"""

from __future__ import annotations

from console.models.dashboard import DashboardRefresh, DashboardRollup, DashboardWaiting
from console.models.exports import AuditExport

__all__ = [
    "AuditExport",
    "DashboardRefresh",
    "DashboardRollup",
    "DashboardWaiting",
]
