"""Settings, read from the environment through small typed helpers.

A bad value stops start-up with a message naming the variable, rather than surfacing
later as a confusing runtime error.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import sys
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
CONSOLE_DIR = Path(__file__).resolve().parent
# templates/ and static/ sit at the top of a checkout; a wheel ships them inside console/.
SHIPPED_DIR = CONSOLE_DIR if (CONSOLE_DIR / "templates").is_dir() else BASE_DIR
VAR_DIR = Path(os.environ.get("SETTLE_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean (use true or false)")


def env_int(name: str, default: int, *, minimum: int = 0, maximum: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not an integer") from None
    if number < minimum:
        raise ImproperlyConfigured(f"{name}={number} is below the minimum of {minimum}")
    if maximum is not None and number > maximum:
        raise ImproperlyConfigured(f"{name}={number} is above the maximum of {maximum}")
    return number


def env_float(name: str, default: float, *, minimum: float = 0.0) -> float:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a number") from None
    if not number >= minimum:  # also refuses nan
        raise ImproperlyConfigured(f"{name}={number} is below the minimum of {minimum}")
    return number


def _generated_secret(name: str, filename: str, *, minimum: int = 32) -> str:
    """``name`` from the environment, else one generated once into var/ (never committed)."""
    value = os.environ.get(name)
    if value is not None:
        if len(value) < minimum:
            raise ImproperlyConfigured(f"{name} must be at least {minimum} characters long")
        return value
    path = VAR_DIR / filename
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(50))
    return path.read_text().strip()


# Bounds on every PostgreSQL session of the web and the workers: how long a connection
# attempt, one statement, one wait for a lock and a transaction left idle may last. A
# statement cut by one answers 503 (``database_timeout``), never hangs the request.
# Management commands (``manage.py``, ``django-admin``: migrate, verify_audit, exports,
# benchmarks) run long statements by design: for them SETTLE_DB_COMMAND_STATEMENT_TIMEOUT_MS
# (0: none) bounds statements and lock waits instead.
_DB_CONNECT_TIMEOUT_SECONDS = env_int("SETTLE_DB_CONNECT_TIMEOUT_SECONDS", 5, minimum=1)
SETTLE_DB_STATEMENT_TIMEOUT_MS = env_int("SETTLE_DB_STATEMENT_TIMEOUT_MS", 30000)
SETTLE_DB_LOCK_TIMEOUT_MS = env_int("SETTLE_DB_LOCK_TIMEOUT_MS", 10000)
SETTLE_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS = env_int(
    "SETTLE_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS", 120000
)
SETTLE_DB_COMMAND_STATEMENT_TIMEOUT_MS = env_int("SETTLE_DB_COMMAND_STATEMENT_TIMEOUT_MS", 0)
# The test runner counts as a command: it creates, flushes and drops whole databases (a
# DROP DATABASE waits for a checkpoint); the servers a test starts are bounded.
_ARGV0 = Path(sys.argv[0] if sys.argv else "")
_COMMAND = (
    _ARGV0.name in {"manage.py", "django-admin"}
    or _ARGV0.parts[-2:] == ("django", "__main__.py")
    or "pytest" in sys.modules
) and sys.argv[1:2] != ["runserver"]


def _db_bounds() -> list[str]:
    """The ``-c`` options that bound this process's sessions (0 turns a bound off)."""
    statement = SETTLE_DB_STATEMENT_TIMEOUT_MS
    lock = SETTLE_DB_LOCK_TIMEOUT_MS
    if _COMMAND:
        statement = lock = SETTLE_DB_COMMAND_STATEMENT_TIMEOUT_MS
    return [
        f"-c statement_timeout={statement}",
        f"-c lock_timeout={lock}",
        f"-c idle_in_transaction_session_timeout={SETTLE_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS}",
    ]


def _database() -> dict[str, object]:
    url = env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'settle.sqlite3'}")
    try:
        config: dict[str, object] = dict(dj_database_url.parse(url, conn_max_age=60))
    except Exception as exc:  # dj-database-url raises several types for a bad URL
        raise ImproperlyConfigured(f"DATABASE_URL is not a usable database URL: {exc}") from None
    engine = str(config.get("ENGINE", ""))
    if engine.endswith("sqlite3"):
        # Writers queue on BEGIN IMMEDIATE instead of failing on lock upgrade; the test
        # database is a file so that real worker processes can share it.
        config["OPTIONS"] = {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
        config["CONN_MAX_AGE"] = 0
        # One file per test run, so that concurrent runs never share (and break) it.
        config["TEST"] = {"NAME": str(VAR_DIR / f"test_settle_{os.getpid()}.sqlite3")}
    elif engine.endswith("postgresql"):
        options = config.setdefault("OPTIONS", {})
        assert isinstance(options, dict)
        if env_bool("SETTLE_DB_PREPARED_STATEMENTS", True):
            # Parameters travel apart from the SQL text, so each statement's text is the
            # same on every call and psycopg prepares it on its connection after a few
            # runs: PostgreSQL then skips parsing and planning (a third of its CPU per
            # API call). Turn off behind a pooler that cannot keep prepared statements
            # (PgBouncer in transaction mode before 1.21).
            options.setdefault("server_side_binding", True)
            options.setdefault("prepare_threshold", 5)
        # A connection held across requests (CONN_MAX_AGE) is checked before a request
        # reuses it, so that a database restart costs no request a dead connection.
        config["CONN_HEALTH_CHECKS"] = True
        # A database that does not answer fails the request in seconds, never hangs it.
        options.setdefault("connect_timeout", _DB_CONNECT_TIMEOUT_SECONDS)
        # No JIT compilation: it pays off for long analytical queries only, and the
        # planner starts it by estimated cost, so a page whose LIMIT stops a scan early
        # but whose estimate is large (the queue's counts) paid 0.5-1 s of compiling per
        # request (docs/benchmarks.md). Then the bounds on each session's statements; a
        # URL's own ``?options=`` comes after these, so it wins.
        given = str(options.get("options", ""))
        options["options"] = " ".join(["-c jit=off", *_db_bounds(), *([given] if given else [])])
    else:
        raise ImproperlyConfigured(f"DATABASE_URL engine {engine!r} is not supported")
    return config


SECRET_KEY = _generated_secret("SECRET_KEY", "secret_key")
# Signs audit checkpoints. It must not live in the database: whoever holds only SQL
# access cannot then rewrite history and re-sign it. Keep a copy off this machine.
SETTLE_AUDIT_KEY = _generated_secret("SETTLE_AUDIT_KEY", "audit_key")
# Every checkpoint is appended here as well, outside the database (ship it elsewhere).
SETTLE_AUDIT_CHECKPOINT_FILE = Path(
    env_str("SETTLE_AUDIT_CHECKPOINT_FILE", str(VAR_DIR / "audit-checkpoints.jsonl"))
)
# Audit exports are written here by a worker, then downloaded from the console.
SETTLE_AUDIT_EXPORT_DIR = Path(env_str("SETTLE_AUDIT_EXPORT_DIR", str(VAR_DIR / "exports")))
# How long a worker may spend writing one export before it is stopped (and marked failed).
SETTLE_AUDIT_EXPORT_SECONDS = env_int("SETTLE_AUDIT_EXPORT_SECONDS", 3600, minimum=60)
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = [h for h in env_str("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",") if h]

# Behind the TLS proxy of a production deployment, SETTLE_HTTPS=true turns on every
# HTTPS protection at once; each can still be set on its own. Off by default so that
# the embedded default serves plain http://127.0.0.1.
HTTPS = env_bool("SETTLE_HTTPS", False)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", HTTPS)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", HTTPS)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", HTTPS)
# The proxy's own health checks, and monitors inside the network, speak plain HTTP.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^livez$"]
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 365 * 24 * 3600 if HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", HTTPS)
# The header only allows preloading; a domain is preloaded when its owner submits it.
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", HTTPS)
# The proxy terminates TLS and says so in this header; trusted only when it sets it.
SETTLE_BEHIND_PROXY = env_bool("SETTLE_BEHIND_PROXY", HTTPS)
if SETTLE_BEHIND_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# How many proxies, each appending the address it was reached from to X-Forwarded-For,
# stand in front of the web processes: the client's address is that many entries from
# the header's right (console.signin.client_address). Read only behind the proxy.
SETTLE_PROXY_COUNT = env_int("SETTLE_PROXY_COUNT", 1, minimum=1)
SESSION_COOKIE_HTTPONLY = True
# Messages wait in the session, on the server: a shown-once token or webhook secret in
# one must never travel in a cookie, which is signed but readable by whoever holds it.
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "guardian",
    "axes",
    "approvals",
    "audit",
    "recovery",
    "webhooks",
    "monitoring",
    "console",
]
# The benchmarks (bench/) are in a checkout, never in the wheel: an app only where importable.
if importlib.util.find_spec("bench") is not None:
    INSTALLED_APPS.append("bench")

# The row that keeps each operation's audit chain head (``audit.models.ChainHolder``).
SETTLE_AUDIT_CHAIN_MODEL = "recovery.Operation"

MIDDLEWARE = [
    "console.logs.RequestIdMiddleware",
    "console.metrics.HostApiMetricsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes asks: it turns a locked-out sign-in into its 429 answer.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "console.urls"
WSGI_APPLICATION = "console.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # The console's own templates first (before the admin's registration pages).
        "DIRS": [SHIPPED_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.context_processors.audit_alarms",
                "console.context_processors.supervises",
            ],
        },
    },
]

DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTHENTICATION_BACKENDS = [
    # First: a locked-out sign-in is refused before any password is checked.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
    "guardian.backends.ObjectPermissionBackend",
]
ANONYMOUS_USER_NAME = None  # guardian: no anonymous user row

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
# A wheel's console/static is the app-directories finder's already.
STATICFILES_DIRS = [BASE_DIR / "static"] if SHIPPED_DIR == BASE_DIR else []
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# Served by WhiteNoise from the finders too, so `runserver` with DEBUG off and tests
# work without a collectstatic step; production runs collectstatic.
WHITENOISE_USE_FINDERS = True

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

# Repeated failed sign-ins (console and admin alike) are throttled by django-axes: after
# SETTLE_LOGIN_FAILURE_LIMIT failures for one username from one address, that pair is
# refused (429) for SETTLE_LOGIN_COOLOFF_MINUTES, and after SETTLE_LOGIN_ADDRESS_FAILURE_LIMIT
# failures from one address for any usernames, that address is. Keyed on the client's
# address (behind the proxy, the one it forwards), so that nobody can lock a colleague out
# from elsewhere, nor try many usernames from one address.
AXES_FAILURE_LIMIT = env_int("SETTLE_LOGIN_FAILURE_LIMIT", 5, minimum=1)
SETTLE_LOGIN_ADDRESS_FAILURE_LIMIT = env_int(
    "SETTLE_LOGIN_ADDRESS_FAILURE_LIMIT", 4 * AXES_FAILURE_LIMIT, minimum=1
)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("SETTLE_LOGIN_COOLOFF_MINUTES", 15, minimum=1))
# In this order: console.signin.SignInLockoutHandler gives each its own limit.
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "ip_address"]
AXES_HANDLER = "console.signin.SignInLockoutHandler"
AXES_CLIENT_IP_CALLABLE = "console.signin.client_address"
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"

# An operator's claim on an operation lapses after this long without an action of theirs
# on it, so that a claim left behind by someone who went home does not block the rest.
SETTLE_CLAIM_IDLE_MINUTES = env_int("SETTLE_CLAIM_IDLE_MINUTES", 30, minimum=1)

# Request bodies above this are refused with 413 before they are parsed.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("SETTLE_MAX_BODY_BYTES", 256 * 1024, minimum=70 * 1024)

# Background recovery (recovery.services.sweep): how often beat sweeps, how many rows
# one sweep transaction takes, and how long a queued lookup may wait for a worker before
# the sweeper queues it again (its message was lost, or its publish never happened).
SETTLE_SWEEP_SECONDS = env_int("SETTLE_SWEEP_SECONDS", 5, minimum=1)
SETTLE_SWEEP_BATCH = env_int("SETTLE_SWEEP_BATCH", 200, minimum=1)
SETTLE_LOOKUP_QUEUE_SECONDS = env_int("SETTLE_LOOKUP_QUEUE_SECONDS", 60, minimum=1)
# Lookups of one provider run by one task: the provider is read once per batch (a journal
# once, a SQLite database with one query) and the answers applied in one transaction.
SETTLE_LOOKUP_BATCH = env_int("SETTLE_LOOKUP_BATCH", 200, minimum=1)
# How often beat signs a checkpoint of the audit log: the window of events that no signed
# checkpoint covers yet is at most this long (plus the time a checkpoint takes).
SETTLE_AUDIT_CHECKPOINT_SECONDS = env_int("SETTLE_AUDIT_CHECKPOINT_SECONDS", 60, minimum=1)
# How often beat verifies the whole audit log (every chain, every checkpoint): what the
# audit trail page shows as "last verified". A full read of the log, so not too often.
SETTLE_AUDIT_VERIFY_SECONDS = env_int("SETTLE_AUDIT_VERIFY_SECONDS", 3600, minimum=1)
# That routine verification covers what the checkpoints signed since the last verified
# one, at most about this many events a run (a backlog takes several runs).
SETTLE_AUDIT_VERIFY_MAX_EVENTS = env_int("SETTLE_AUDIT_VERIFY_MAX_EVENTS", 2_000_000, minimum=1)
# The full verification (every event, every checkpoint) is a job done in slices: beat
# runs one slice of about SETTLE_AUDIT_VERIFY_SLICE_EVENTS events every
# SETTLE_AUDIT_VERIFY_FULL_SECONDS, and starts a new job SETTLE_AUDIT_VERIFY_FULL_HOURS
# after the last one started.
SETTLE_AUDIT_VERIFY_SLICE_EVENTS = env_int(
    "SETTLE_AUDIT_VERIFY_SLICE_EVENTS", 500_000, minimum=1000
)
SETTLE_AUDIT_VERIFY_FULL_SECONDS = env_int("SETTLE_AUDIT_VERIFY_FULL_SECONDS", 300, minimum=1)
SETTLE_AUDIT_VERIFY_FULL_HOURS = env_int("SETTLE_AUDIT_VERIFY_FULL_HOURS", 24, minimum=1)
# Bulk work (console.services.bulk): the most operations one batch may hold, how many
# items one task message does, how long a running batch may go without progress before
# beat publishes its pending items again (its worker died, its messages were lost), and
# how often beat checks.
SETTLE_BULK_MAX_ITEMS = env_int("SETTLE_BULK_MAX_ITEMS", 10000, minimum=1)
SETTLE_BULK_CHUNK = env_int("SETTLE_BULK_CHUNK", 100, minimum=1)
SETTLE_BULK_LEASE_SECONDS = env_int("SETTLE_BULK_LEASE_SECONDS", 30, minimum=1)
SETTLE_BULK_RESUME_SECONDS = env_int("SETTLE_BULK_RESUME_SECONDS", 10, minimum=1)

# How often beat adds the audit log's new events to the dashboard's rollup (lookups,
# settle times, operator actions); its figures trail the log by this plus two minutes.
SETTLE_DASHBOARD_REFRESH_SECONDS = env_int("SETTLE_DASHBOARD_REFRESH_SECONDS", 60, minimum=1)

# Webhooks to hosts (the webhooks app). An endpoint on the machine itself or a
# private network is refused unless SETTLE_WEBHOOKS_ALLOW_PRIVATE (a deployment that
# delivers inside its own network); checked when added and again at every delivery.
SETTLE_WEBHOOKS_ALLOW_PRIVATE = env_bool("SETTLE_WEBHOOKS_ALLOW_PRIVATE", False)
# One delivery's whole exchange (connect, send, status, headers, body), however slowly the
# receiver trickles it: a slow receiver costs a delivery thread this long at most. At most
# 30 s, so that a delivery task's last send ends well inside its soft time limit.
SETTLE_WEBHOOK_TIMEOUT_SECONDS = env_int("SETTLE_WEBHOOK_TIMEOUT_SECONDS", 5, minimum=1, maximum=30)
# How often beat delivers what is due (commits also nudge a delivery at once, so this is
# for retries and missed nudges: each round is a task on SETTLE_WEBHOOK_QUEUE), how many
# messages one claim takes, and how long a claim holds them: longer than a task may live
# (CELERY_TASK_TIME_LIMIT), so only a dead worker's claims lapse and are delivered again.
SETTLE_WEBHOOK_SECONDS = env_int("SETTLE_WEBHOOK_SECONDS", 10, minimum=1)
SETTLE_WEBHOOK_BATCH = env_int("SETTLE_WEBHOOK_BATCH", 50, minimum=1)
SETTLE_WEBHOOK_LEASE_SECONDS = env_int("SETTLE_WEBHOOK_LEASE_SECONDS", 120, minimum=1)
if SETTLE_WEBHOOK_LEASE_SECONDS <= SETTLE_WEBHOOK_TIMEOUT_SECONDS:
    # A send starts only while its claim outlasts its deadline: else none ever would.
    raise ImproperlyConfigured(
        f"SETTLE_WEBHOOK_LEASE_SECONDS={SETTLE_WEBHOOK_LEASE_SECONDS} must exceed "
        f"SETTLE_WEBHOOK_TIMEOUT_SECONDS={SETTLE_WEBHOOK_TIMEOUT_SECONDS}"
    )
# Retried with exponential back-off and jitter for this long, then given up (``failed``,
# an operator may redeliver); an endpoint is marked failing after this many errors in a row.
SETTLE_WEBHOOK_RETRY_HOURS = env_int("SETTLE_WEBHOOK_RETRY_HOURS", 24, minimum=1)
SETTLE_WEBHOOK_FAILING_AFTER = env_int("SETTLE_WEBHOOK_FAILING_AFTER", 5, minimum=1)
# After ``webhook rotate`` the old secret signs beside the new one for this long.
SETTLE_WEBHOOK_ROTATION_GRACE_HOURS = env_int("SETTLE_WEBHOOK_ROTATION_GRACE_HOURS", 24)

# Alerts to operators (``monitoring.services.alerts``): how often beat evaluates the rules,
# and the console's address, which every alert links into.
SETTLE_ALERTS_SECONDS = env_int("SETTLE_ALERTS_SECONDS", 60, minimum=1)
SETTLE_CONSOLE_URL = env_str("SETTLE_CONSOLE_URL", "http://127.0.0.1:8000").rstrip("/")
# How often beat counts the operations in every state into ``OperationCount``: the
# terminal states' figures on /metrics are that old at most (the others are live).
SETTLE_OPERATION_COUNTS_SECONDS = env_int("SETTLE_OPERATION_COUNTS_SECONDS", 300, minimum=10)
# /metrics answers only with this bearer token; without one configured it answers 404.
SETTLE_METRICS_TOKEN = env_str("SETTLE_METRICS_TOKEN", "")
if SETTLE_METRICS_TOKEN and len(SETTLE_METRICS_TOKEN) < 16:
    raise ImproperlyConfigured("SETTLE_METRICS_TOKEN must be at least 16 characters long")
# prometheus-client's multiprocess mode: every process of this machine (web, worker)
# writes its counters here, and /metrics sums them. It must be in the environment before
# prometheus_client is imported, which no module does before the settings are read.
SETTLE_METRICS_DIR = Path(
    env_str(
        "SETTLE_METRICS_DIR", os.environ.get("PROMETHEUS_MULTIPROC_DIR") or str(VAR_DIR / "metrics")
    )
)
SETTLE_METRICS_DIR.mkdir(parents=True, exist_ok=True)
os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(SETTLE_METRICS_DIR)
# The status page (and /healthz?detail=1) turns a fact red past these ages.
SETTLE_STATUS_SWEEP_STALE_SECONDS = env_int(
    "SETTLE_STATUS_SWEEP_STALE_SECONDS", max(60, 6 * SETTLE_SWEEP_SECONDS), minimum=1
)
SETTLE_STATUS_LOOKUP_LAG_SECONDS = env_int("SETTLE_STATUS_LOOKUP_LAG_SECONDS", 300, minimum=1)
SETTLE_STATUS_WEBHOOK_LAG_SECONDS = env_int("SETTLE_STATUS_WEBHOOK_LAG_SECONDS", 300, minimum=1)
# An audit event unsigned this long means checkpoints are late (the older name still
# read); a routine verification older than SETTLE_AUDIT_VERIFY_LATE_SECONDS, or a full
# one older than SETTLE_AUDIT_VERIFY_FULL_LATE_SECONDS, means verification is late.
SETTLE_AUDIT_CHECKPOINT_LATE_SECONDS = env_int(
    "SETTLE_AUDIT_CHECKPOINT_LATE_SECONDS",
    env_int(
        "SETTLE_STATUS_CHECKPOINT_STALE_SECONDS",
        3 * SETTLE_AUDIT_CHECKPOINT_SECONDS + 60,
        minimum=1,
    ),
    minimum=1,
)
SETTLE_STATUS_CHECKPOINT_STALE_SECONDS = SETTLE_AUDIT_CHECKPOINT_LATE_SECONDS
SETTLE_AUDIT_VERIFY_LATE_SECONDS = env_int(
    "SETTLE_AUDIT_VERIFY_LATE_SECONDS", 2 * SETTLE_AUDIT_VERIFY_SECONDS + 300, minimum=1
)
SETTLE_AUDIT_VERIFY_FULL_LATE_SECONDS = env_int(
    "SETTLE_AUDIT_VERIFY_FULL_LATE_SECONDS", 2 * 3600 * SETTLE_AUDIT_VERIFY_FULL_HOURS, minimum=1
)
# Liveness, judged by the web processes from the database alone (/livez and the
# settle_*_last_seen_seconds gauges): beat is silent when it published no sweep for
# SETTLE_LIVENESS_BEAT_SECONDS, a queue's workers when none of them ran the queue's
# heartbeat (each worker sends one every SETTLE_WORKER_HEARTBEAT_SECONDS) for
# SETTLE_LIVENESS_WORKER_SECONDS.
SETTLE_WORKER_HEARTBEAT_SECONDS = env_int("SETTLE_WORKER_HEARTBEAT_SECONDS", 10, minimum=1)
SETTLE_LIVENESS_BEAT_SECONDS = env_int(
    "SETTLE_LIVENESS_BEAT_SECONDS", max(60, 6 * SETTLE_SWEEP_SECONDS), minimum=1
)
SETTLE_LIVENESS_WORKER_SECONDS = env_int(
    "SETTLE_LIVENESS_WORKER_SECONDS", max(120, 6 * SETTLE_WORKER_HEARTBEAT_SECONDS), minimum=1
)
if SETTLE_LIVENESS_BEAT_SECONDS <= SETTLE_SWEEP_SECONDS:
    raise ImproperlyConfigured(
        "SETTLE_LIVENESS_BEAT_SECONDS must be longer than SETTLE_SWEEP_SECONDS"
    )
if SETTLE_LIVENESS_WORKER_SECONDS <= SETTLE_WORKER_HEARTBEAT_SECONDS:
    raise ImproperlyConfigured(
        "SETTLE_LIVENESS_WORKER_SECONDS must be longer than SETTLE_WORKER_HEARTBEAT_SECONDS"
    )

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
# The host API's limit per credential (host or approver token): on average this many
# requests a second, at most SETTLE_HOST_RATE_BURST at once; beyond it, 429 with
# Retry-After. 0 turns the limit off.
SETTLE_HOST_RATE_PER_SECOND = env_int("SETTLE_HOST_RATE_PER_SECOND", 200)
SETTLE_HOST_RATE_BURST = env_int("SETTLE_HOST_RATE_BURST", 2 * SETTLE_HOST_RATE_PER_SECOND)
if SETTLE_HOST_RATE_PER_SECOND and SETTLE_HOST_RATE_BURST < SETTLE_HOST_RATE_PER_SECOND:
    raise ImproperlyConfigured(
        "SETTLE_HOST_RATE_BURST must be at least SETTLE_HOST_RATE_PER_SECOND"
    )
# Per operation and refusal code, the first this many refusals of a window are recorded
# one by one (a permit event and an audit event each); the rest of the window's are
# counted in one summary event. The caller is told of every refusal either way.
SETTLE_REFUSALS_RECORDED_PER_MINUTE = env_int("SETTLE_REFUSALS_RECORDED_PER_MINUTE", 20, minimum=1)
SETTLE_REFUSAL_WINDOW_SECONDS = 60

# One queue name per deployment (and per test run, so parallel runs never collide).
CELERY_TASK_DEFAULT_QUEUE = env_str("SETTLE_CELERY_QUEUE", "settle")
# Webhook deliveries have a queue of their own, consumed by a worker of its own
# (`celery -A console worker -Q settle-webhooks`): a receiver that accepts and never
# answers holds only that worker, never the ones the sweep and the lookups need.
# Set it to SETTLE_CELERY_QUEUE (or blank) to deliver on the one queue, unprotected.
SETTLE_WEBHOOK_QUEUE = (
    env_str("SETTLE_WEBHOOK_QUEUE", f"{CELERY_TASK_DEFAULT_QUEUE}-webhooks")
    or CELERY_TASK_DEFAULT_QUEUE
)
# Acknowledge after the task ran, not on receipt: a worker that dies mid-task leaves its
# message to be delivered again; every task is safe to run twice.
CELERY_TASK_ACKS_LATE = True
# A pool process killed mid-task (SIGKILL, OOM, hard limit) requeues its message at once
# instead of acknowledging it as failed.
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# Reserve one message at a time: lookups are slow and uneven, and a second reserved
# message would wait behind the first instead of going to an idle worker.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A lookup is bounded by its provider's timeout (at most 60 s, a database constraint):
# past 75 s something is stuck; the soft limit raises inside the task so it ends cleanly.
CELERY_TASK_SOFT_TIME_LIMIT = 75
# The hard limit kills the pool process; its lookup's lease lapses and it is run again.
CELERY_TASK_TIME_LIMIT = 90
# Nobody reads task results: outcomes are in the database, on the operation's record.
CELERY_TASK_IGNORE_RESULT = True
# Give up publishing quickly when the broker is down: the durable due time on the row,
# not the message, schedules the work, and the next sweep publishes again.
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": SETTLE_BROKER_PUBLISH_RETRIES,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.5,
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True  # a worker waits for its broker
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE = {
    # Lapsed leases to unknown, due lookups queued. A sweep not started within one
    # interval is dropped (expires): the next one does the same work.
    "sweep": {
        "task": "recovery.tasks.sweep",
        "schedule": float(SETTLE_SWEEP_SECONDS),
        "options": {"expires": float(SETTLE_SWEEP_SECONDS)},
    },
    # Bounds the window of audit events no signed checkpoint covers yet.
    "audit-checkpoint": {
        "task": "audit.tasks.audit_checkpoint",
        "schedule": float(SETTLE_AUDIT_CHECKPOINT_SECONDS),
        "options": {"expires": float(SETTLE_AUDIT_CHECKPOINT_SECONDS)},
    },
    # Running bulk batches whose lease lapsed with items pending are published again.
    "bulk-resume": {
        "task": "console.tasks.bulk_resume",
        "schedule": float(SETTLE_BULK_RESUME_SECONDS),
        "options": {"expires": float(SETTLE_BULK_RESUME_SECONDS)},
    },
    "dashboard-refresh": {
        "task": "console.tasks.dashboard_refresh",
        "schedule": float(SETTLE_DASHBOARD_REFRESH_SECONDS),
        "options": {"expires": float(SETTLE_DASHBOARD_REFRESH_SECONDS)},
    },
    # Due webhooks delivered, and any message left waiting behind nothing made due.
    "webhooks-deliver": {
        "task": "webhooks.tasks.webhooks_deliver",
        "schedule": float(SETTLE_WEBHOOK_SECONDS),
        "options": {
            "expires": float(SETTLE_WEBHOOK_SECONDS),
            "queue": SETTLE_WEBHOOK_QUEUE,
        },
    },
    # Alert rules evaluated; grouped messages and "resolved" ones sent.
    "alerts": {
        "task": "monitoring.tasks.alerts_evaluate",
        "schedule": float(SETTLE_ALERTS_SECONDS),
        "options": {"expires": float(SETTLE_ALERTS_SECONDS)},
    },
    # The snapshot of operations by state that /metrics reads for the terminal states.
    "operation-counts": {
        "task": "monitoring.tasks.operation_counts",
        "schedule": float(SETTLE_OPERATION_COUNTS_SECONDS),
        "options": {"expires": float(SETTLE_OPERATION_COUNTS_SECONDS)},
    },
    "audit-verify": {
        "task": "audit.tasks.audit_verify",
        "schedule": float(SETTLE_AUDIT_VERIFY_SECONDS),
        "options": {"expires": float(SETTLE_AUDIT_VERIFY_SECONDS)},
    },
    # One slice of the full verification job, which goes on from where the last stopped.
    "audit-verify-full": {
        "task": "audit.tasks.audit_verify_full",
        "schedule": float(SETTLE_AUDIT_VERIFY_FULL_SECONDS),
        "options": {"expires": float(SETTLE_AUDIT_VERIFY_FULL_SECONDS)},
    },
}

# Plain text by default; SETTLE_LOG_FORMAT=json writes one JSON object per line. Every
# record made while a request is handled carries its request id (X-Request-ID).
_LOG_FORMAT = env_str("SETTLE_LOG_FORMAT", "text")
if _LOG_FORMAT not in {"text", "json"}:
    raise ImproperlyConfigured(f"SETTLE_LOG_FORMAT={_LOG_FORMAT!r} is not text or json")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_id": {"()": "console.logs.RequestIdFilter"}},
    "formatters": {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"},
        "json": {"()": "console.logs.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "filters": ["request_id"],
            "formatter": _LOG_FORMAT,
        }
    },
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "WARNING")},
}
