"""Monitoring's writes, one module per concern.

- ``pulses``: the queues' signs of life and the operation count snapshot;
- ``alerts``: alert rules (saved and deleted, audited), their evaluation by beat and
  the messages sent through Apprise.
"""
