"""Database helpers under the apps, importing none of them: they write the statements the
ORM cannot (or cannot cheaply), for the modules that need them.

A statement that one module alone runs stays in that module (the queue's selector, the
audit log's verification, the webhooks' outbox, the transitions, locking); what is here
is what several share.

``rows``
    Reads written out instead of built by the ORM (the host API's path, batches).
``writes``
    Inserts, updates and batches written out the same way.
``cursor``
    The cursor they run on (libpq's own calls on PostgreSQL), the default connection
    pinned for a transaction, the database's vendor.
``clock``
    The database's clock: the one place that knows how each database reads it.
``errors``
    Which database errors are an outage or a bound (503, worth a retry).
"""
