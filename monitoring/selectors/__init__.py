"""Monitoring's reads: the system's view, not a user's.

- ``health``: the health facts (sweeps, lookups, operations by state, stuck ages,
  checkpoints, webhook backlog) and the signs of life, read by /metrics, the status
  page, /healthz, /livez and the alert rules.
"""
