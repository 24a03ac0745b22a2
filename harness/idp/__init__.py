"""The tests' own OpenID Connect provider: a tiny Django project on ``allauth.idp.oidc``.

It runs as a process of its own (``python -m harness.idp.serve``, started by
``harness.oidc``), with its own SQLite database, signing key and cookies, all in one
state folder. Who may sign in, with which claims, and the faults its next ID tokens carry
come from a directory file it reads at every request (``harness.idp.directory``),
so a test changes them by rewriting that file, without a restart.
"""
