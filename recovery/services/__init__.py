"""The recovery core's services, one module per concern.

Every function that writes runs one explicit ``audit_transaction``, changes state only
through ``operation_transition`` (``recovery.transitions``) and audits in the same
transaction. ``locking`` states the lock order every module follows.

- ``errors``: what a refused call raises, with a stable code;
- ``credentials``, ``providers``: hosts and provider configuration;
- ``locking``: finding and locking the operation a call is about;
- ``registration``, ``permits``: register, approve, revoke;
- ``dispatch``: the one dispatch, heartbeats, the worker's report;
- ``evidence``, ``lookups``, ``callbacks``: the provider's word and how it is judged;
- ``signals``: late and out-of-turn signals, recorded;
- ``resume``: what a fresh worker should do.
"""
