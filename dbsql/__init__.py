"""Hand-written SQL, in one place: the infrastructure under the apps, importing none of them.

``rows``
    Statements written out instead of built by the ORM (the host API's path, batches).
``clock``
    The database's clock: the one place that knows how each database reads it.
``errors``
    Which database errors are an outage or a bound (503, worth a retry).

Only what measured CPU justified lives here; everything else stays with the ORM.
"""
