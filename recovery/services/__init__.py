"""The recovery core's services, one module per concern.

Every function that writes runs one explicit ``audit_transaction``, changes state only
through ``operation_transition`` (``recovery.transitions``) and audits in the same
transaction. ``locking`` states the lock order every module follows.

- ``errors``: what a refused call raises, with a stable code;
- ``access``: who may act on a provider's operations, the check every service acting
  for a console user makes (the permissions themselves: ``recovery.permissions``);
- ``credentials``, ``providers``, ``roles``: hosts' and approvers' tokens, provider
  configuration, console roles granted per provider;
- ``locking``: finding and locking the operation a call is about;
- ``registration``, ``permits``: register; open, decide and revoke approvals;
- ``dispatch``: the one dispatch, heartbeats, the worker's report;
- ``resume``: what a fresh worker should do;
- ``evidence``, ``lookups``, ``callbacks``: the provider's word and how it is judged;
- ``sweep``: background recovery, the lapsed leases and the lookups due;
- ``approval_expiry``: approvals nobody decided by their ``expires_at``, expired;
- ``lookup_tasks``: what a worker does with the lookups queued, one or a batch;
- ``runs``: when the sweep and each provider's lookups last ran (read by monitoring);
- ``stale_signals``: late and out-of-turn signals, recorded, never applied;
- ``refusals``: a refusal recorded and committed before it goes on to the caller;
- ``claims``, ``operator``, ``reconcile``: what operators do from the console — claim,
  look up, confirm, repair, void — proposed where evidence does not back it;
- ``four_eyes``: a second operator approves or rejects what was proposed.
"""
