"""``manage.py demo``: Settle on the embedded default, seeded by a fleet of real crashes.

scenario
    What one demo worker process does with one operation: finish normally, die (SIGKILL,
    from the demo) before or after the provider commits, write a record with other
    parameters or a corrupt checksum, meet a provider that is down, or only ask for an
    approval. Listed in :mod:`console.demo.fleet`.
worker
    :mod:`console.demo.worker`, a separate OS process that talks to Settle only through
    the host HTTP API and writes the provider's record the way the provider's own tool
    would. Nothing in the demo inserts Settle rows for an operation: every stuck
    operation is left behind by a process that was really killed.
batch
    One run of the fleet; its keys start with ``demo-b<N>-``, so a second run adds a
    batch to the same database and keeps the first.
"""
