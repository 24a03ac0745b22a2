"""The console's own writes, one module per area; none re-exported here.

Each builds on the recovery core's services (``recovery.services``) and audits through
``audit``; nothing below the console imports these.

- ``dashboard``: the supervisor dashboard's refresh, its hourly rollup of the audit log;
- ``dashboard_waiting``: what the dashboard counts as stuck, and its summary;
- ``audit_export``: audit exports as jobs, written to a file by a worker;
- ``audit_trail``: what people do with the audit log itself (export records, resolve
  alarms).
"""
