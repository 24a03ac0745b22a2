"""The broker and the shared cache: where Celery's messages and the rate limit's counts
live, and how long a call to either may take.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from settle.settings_env import VAR_DIR, env_float, env_int, env_str

# Celery: Redis (or RabbitMQ) in production; a filesystem broker under var/ for the
# embedded default, so trying Settle out needs no services (a worker process is still
# needed: tasks never run inside a web request; resume and the console's "Look up now"
# only publish the lookup they queued, after its commit).
_broker_dir = VAR_DIR / "broker"
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
# How long one attempt to connect to the broker, and one command on it, may take; and
# how many times a failed publish is tried again (none: redis-py already reconnects a
# connection the broker dropped, and a hung broker would cost every try in full).
SETTLE_BROKER_CONNECT_TIMEOUT_SECONDS = env_float(
    "SETTLE_BROKER_CONNECT_TIMEOUT_SECONDS", 1.0, minimum=0.1
)
SETTLE_BROKER_SOCKET_TIMEOUT_SECONDS = env_float(
    "SETTLE_BROKER_SOCKET_TIMEOUT_SECONDS", 1.0, minimum=0.1
)
SETTLE_BROKER_PUBLISH_RETRIES = env_int("SETTLE_BROKER_PUBLISH_RETRIES", 0)
CELERY_BROKER_CONNECTION_TIMEOUT = SETTLE_BROKER_CONNECT_TIMEOUT_SECONDS
# Workers and beat wait for a broker that is gone, and reconnect when it is back.
CELERY_BROKER_CONNECTION_RETRY = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {}
if CELERY_BROKER_URL == "filesystem://":
    for sub in ("out", "processed", "control"):
        (_broker_dir / sub).mkdir(parents=True, exist_ok=True)
    # kombu's, each message renamed into place once written (``settle.filesystem_broker``).
    CELERY_BROKER_TRANSPORT = "settle.filesystem_broker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "out"),
        "data_folder_out": str(_broker_dir / "out"),
        "data_folder_processed": str(_broker_dir / "processed"),
        # Exchange bindings and the workers' control messages (else ./control).
        "control_folder": str(_broker_dir / "control"),
    }
elif CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        # Redis hands an unacknowledged message to another worker after this long, so it
        # must exceed the longest a task may live (the hard time limit, 90 s) and the
        # longest retry countdown (a lookup's lease, at most 65 s): else a live task runs
        # twice. A dead worker's messages wait this long; the sweeper does not.
        "visibility_timeout": 300,
        # A broker that does not answer (down, or hung: accepting and never replying)
        # fails a publish within these, never holds a web request: the rows, not the
        # messages, are the record, and the sweeps publish again what was not taken.
        "socket_connect_timeout": SETTLE_BROKER_CONNECT_TIMEOUT_SECONDS,
        "socket_timeout": SETTLE_BROKER_SOCKET_TIMEOUT_SECONDS,
    }
# The shared cache behind the host API's rate limit: Redis in production (by default the
# broker's, when it is Redis), so that every gunicorn worker on every machine counts
# against the same limit; a file cache under var/ for the embedded default (shared by
# the processes of one machine). A cache that does not answer within half a second is
# skipped, and the request goes on unlimited.
_cache_default = (
    CELERY_BROKER_URL if CELERY_BROKER_URL.startswith(("redis://", "rediss://")) else ""
)
SETTLE_CACHE_URL = env_str("SETTLE_CACHE_URL", _cache_default or f"file://{VAR_DIR / 'cache'}")


def _cache(url: str) -> dict[str, object]:
    if url.startswith(("redis://", "rediss://")):
        return {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": url,
            "KEY_PREFIX": "settle",
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
        }
    if url.startswith("file://"):
        return {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": url.removeprefix("file://"),
        }
    if url == "locmem://":
        return {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    raise ImproperlyConfigured(
        f"SETTLE_CACHE_URL={url!r}: use redis://, rediss://, file:///a/folder or locmem://"
    )


CACHES = {"default": _cache(SETTLE_CACHE_URL)}
