"""Who may reach Settle and how: keys, hosts, HTTPS behind the proxy, sign-in and its
throttle, and the limits on requests.
"""

from __future__ import annotations

from datetime import timedelta

from django.core.exceptions import ImproperlyConfigured

from settle.settings_env import _generated_secret, env_bool, env_int, env_str

SECRET_KEY = _generated_secret("SECRET_KEY", "secret_key")
# Signs audit checkpoints. It must not live in the database: whoever holds only SQL
# access cannot then rewrite history and re-sign it. Keep a copy off this machine.
SETTLE_AUDIT_KEY = _generated_secret("SETTLE_AUDIT_KEY", "audit_key")
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
# the header's right (identity.throttle.client_address). Read only behind the proxy.
SETTLE_PROXY_COUNT = env_int("SETTLE_PROXY_COUNT", 1, minimum=1)
SESSION_COOKIE_HTTPONLY = True
# Messages wait in the session, on the server: a shown-once token or webhook secret in
# one must never travel in a cookie, which is signed but readable by whoever holds it.
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"

AUTHENTICATION_BACKENDS = [
    # First: a locked-out sign-in is refused before any password is checked.
    "axes.backends.AxesStandaloneBackend",
    # A password; once single sign-on is on, a superuser's alone (identity.backends).
    "identity.backends.PasswordBackend",
    "guardian.backends.ObjectPermissionBackend",
]
ANONYMOUS_USER_NAME = None  # guardian: no anonymous user row

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
# In this order: identity.throttle.SignInLockoutHandler gives each its own limit.
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "ip_address"]
AXES_HANDLER = "identity.throttle.SignInLockoutHandler"
AXES_CLIENT_IP_CALLABLE = "identity.throttle.client_address"
AXES_USERNAME_CALLABLE = "identity.throttle.username_of"
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"

# Request bodies above this are refused with 413 before they are parsed.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("SETTLE_MAX_BODY_BYTES", 256 * 1024, minimum=70 * 1024)
# The host API's limit per credential (host or approver token): on average this many
# requests a second, at most SETTLE_HOST_RATE_BURST at once; beyond it, 429 with
# Retry-After. 0 turns the limit off.
SETTLE_HOST_RATE_PER_SECOND = env_int("SETTLE_HOST_RATE_PER_SECOND", 200)
SETTLE_HOST_RATE_BURST = env_int("SETTLE_HOST_RATE_BURST", 2 * SETTLE_HOST_RATE_PER_SECOND)
if SETTLE_HOST_RATE_PER_SECOND and SETTLE_HOST_RATE_BURST < SETTLE_HOST_RATE_PER_SECOND:
    raise ImproperlyConfigured(
        "SETTLE_HOST_RATE_BURST must be at least SETTLE_HOST_RATE_PER_SECOND"
    )
# A web process keeps the credential a token named this long: disabling or rotating a
# credential takes effect everywhere within it (recovery.services.token_cache).
SETTLE_CREDENTIAL_CACHE_SECONDS = env_int("SETTLE_CREDENTIAL_CACHE_SECONDS", 5, minimum=0)
# Reads of an operation held for its approval's decision (?wait=) at once, per web
# process (recovery.services.waits); past it they answer at once. A held read holds a
# thread, so none by default; under gunicorn, settle.gunicorn_conf sets it to half of
# --threads (none for one-thread workers).
SETTLE_APPROVAL_WAITS = env_int("SETTLE_APPROVAL_WAITS", 0, minimum=0)
# Per operation and refusal code, the first this many refusals of a window are recorded
# one by one (a permit event and an audit event each); the rest of the window's are
# counted in one summary event. The caller is told of every refusal either way.
SETTLE_REFUSALS_RECORDED_PER_MINUTE = env_int("SETTLE_REFUSALS_RECORDED_PER_MINUTE", 20, minimum=1)
SETTLE_REFUSAL_WINDOW_SECONDS = 60
