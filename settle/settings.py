"""Settings, read from the environment through small typed helpers.

This module assembles them: Django's own (apps, middleware, templates, static files,
logging) are here, each other concern in a ``settings_*`` module beside it. A bad value
stops start-up with a message naming the variable, rather than surfacing later as a
confusing runtime error.
"""

from __future__ import annotations

import importlib.util

from django.core.exceptions import ImproperlyConfigured

# Django reads every upper-case name of this module, those of the modules below included.
from settle.settings_background import *  # noqa: F403
from settle.settings_broker import *  # noqa: F403
from settle.settings_celery import *  # noqa: F403
from settle.settings_customers import *  # noqa: F403
from settle.settings_database import *  # noqa: F403
from settle.settings_env import *  # noqa: F403
from settle.settings_env import BASE_DIR, SHIPPED_DIR, VAR_DIR, env_int, env_str
from settle.settings_identity import *  # noqa: F403
from settle.settings_monitoring import *  # noqa: F403
from settle.settings_security import *  # noqa: F403

INSTALLED_APPS = [
    # First: its ready() puts settle.locals in front of Django's per-thread state.
    "settle",
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
    # Sign-in (identity): local accounts, OpenID Connect, passkeys.
    "allauth",
    "allauth.account",
    "allauth.socialaccount",
    "allauth.socialaccount.providers.openid_connect",
    "allauth.mfa",
    # Each user's sessions, to end them (identity.sessions).
    "allauth.usersessions",
    "approvals",
    "audit",
    "policies",
    "recovery",
    "webhooks",
    "monitoring",
    "identity",
    "bulk",
    "customers",
    "console",
]
# The benchmarks (bench/) are in a checkout, never in the wheel: an app only where importable.
if importlib.util.find_spec("bench") is not None:
    INSTALLED_APPS.append("bench")

# The row that keeps each operation's audit chain head (``audit.models.ChainHolder``).
SETTLE_AUDIT_CHAIN_MODEL = "recovery.Operation"

MIDDLEWARE = [
    "settle.logs.RequestIdMiddleware",
    "settle.metrics.HostApiMetricsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # A host's request signed with a token goes from here straight to its view.
    "recovery.middleware.TokenRequestMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Signs out a session idle too long (identity.sessions); then usersessions' own,
    # which with activity tracking off does nothing per request.
    "identity.sessions.IdleSignOutMiddleware",
    "allauth.usersessions.middleware.UserSessionsMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    # After allauth's: a supervisor who has not used a passkey sees only the passkey pages.
    "identity.passkeys.PasskeyRequiredMiddleware",
    # Last, as django-axes asks: it turns a locked-out sign-in into its 429 answer.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "settle.urls"
WSGI_APPLICATION = "settle.wsgi.application"

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
                "console.context_processors.decides",
                "console.context_processors.acts",
            ],
        },
    },
]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
# Translations serve the customer's pages alone (customers.pages picks the browser's
# language there, with no LocaleMiddleware): the console stays in LANGUAGE_CODE.
USE_I18N = True
# The customer pages' languages: their catalogues are customers/locale/<language>.
LANGUAGES = [("en", "English"), ("de", "Deutsch")]
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

# An operator's claim on an operation lapses after this long without an action of theirs
# on it, so that a claim left behind by someone who went home does not block the rest.
SETTLE_CLAIM_IDLE_MINUTES = env_int("SETTLE_CLAIM_IDLE_MINUTES", 30, minimum=1)

# Plain text by default; SETTLE_LOG_FORMAT=json writes one JSON object per line. Every
# record made while a request is handled carries its request id (X-Request-ID).
_LOG_FORMAT = env_str("SETTLE_LOG_FORMAT", "text")
if _LOG_FORMAT not in {"text", "json"}:
    raise ImproperlyConfigured(f"SETTLE_LOG_FORMAT={_LOG_FORMAT!r} is not text or json")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "request_id": {"()": "settle.logs.RequestIdFilter"},
        "refusal": {"()": "settle.logs.RefusalFilter"},
    },
    "formatters": {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"},
        "json": {"()": "settle.logs.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "filters": ["request_id", "refusal"],
            "formatter": _LOG_FORMAT,
        }
    },
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "WARNING")},
}
