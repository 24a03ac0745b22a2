"""Real servers, processes and authenticators that the tests and the benchmarks both start;
not shipped.

Gunicorn and Celery processes, the providers' SQLite files and HTTP provider, the fleet of
API clients, the soft passkey, the OpenID Connect IdP and single sign-on against it, the
accounts' password. ``tests`` and ``bench`` import from here; nothing here imports them.
"""
