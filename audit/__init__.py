"""The append-only audit log: one hash chain per operation, signed checkpoints, alarms.

- ``hashing``: how an event is hashed, read back as a row and exported;
- ``chain``: appending events, in the transaction of the change they describe;
- ``seal``, ``checkpoints``: the log's own signature under the audit key, on the chains'
  new heads, each an extension of what was signed; ``checkpoint_file``: the same
  checkpoints in a file outside the database;
- ``alarms``: the chains a checkpoint refused to sign, until a supervisor resolves them;
- ``signed_decisions``: a person's passkey-signed decisions, checked from the log alone;
- ``seal_verify``, ``verify_walk``: checking the whole log, every chain against every
  checkpoint; ``verification``: the routine and full verifications on the record.

Import from the module that owns a name: this package re-exports nothing, since the
app's models load after it.
"""
