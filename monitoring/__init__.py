"""Monitoring: metrics exposition, health facts, liveness, pulses and alert rules.

It reads what the core (``recovery``) and the webhooks record and never writes their
state; nothing below it imports it. The console's system views (status, /healthz,
/livez, /metrics) serve what it computes.
"""
