"""Settings of the tests' identity provider (``DJANGO_SETTINGS_MODULE=harness.idp.settings``).

Everything it keeps is in ``IDP_STATE_DIR`` (a temporary folder the fixture made): its
SQLite database, its signing key (``key.pem``, RSA, written by the fixture), the directory
of people and the clients. ``IDP_ISSUER`` is the issuer it names (``http://localhost:<port>``),
whatever Host a request carries.
"""

from __future__ import annotations

import os
from pathlib import Path

STATE_DIR = Path(os.environ["IDP_STATE_DIR"])
IDP_ISSUER = os.environ["IDP_ISSUER"]

# A throwaway provider for tests: nothing it signs or stores outlives the run.
SECRET_KEY = "the-tests-identity-provider-not-a-secret"
DEBUG = False
ALLOWED_HOSTS = ["localhost", "127.0.0.1"]
ROOT_URLCONF = "harness.idp.urls"
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "allauth",
    "allauth.account",
    "allauth.idp.oidc",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    "harness.idp.middleware.clients_sync",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    }
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": STATE_DIR / "idp.sqlite3",
        # runserver answers each request in a thread: let writers wait for each other.
        "OPTIONS": {"timeout": 20},
    }
}

# Settle runs on the same host (localhost, another port), and cookies ignore ports: the
# IdP's cookies must not take the place of Settle's in a browser.
SESSION_COOKIE_NAME = "idp_sessionid"
CSRF_COOKIE_NAME = "idp_csrftoken"

# People sign in with the username and password the directory file gives them.
AUTHENTICATION_BACKENDS = ["harness.idp.backends.DirectoryBackend"]
LOGIN_URL = "account_login"
ACCOUNT_LOGIN_METHODS = {"username"}
ACCOUNT_SIGNUP_FIELDS = ["username*", "password1*", "password2*"]
ACCOUNT_EMAIL_VERIFICATION = "none"
ACCOUNT_ADAPTER = "harness.idp.adapter.AccountAdapter"
# The suite signs in again and again from 127.0.0.1, on purpose with wrong passwords too.
ACCOUNT_RATE_LIMITS = False
# Only client secrets are hashed here (people's passwords are in the directory file):
# a fast hasher keeps each token request quick; nothing here protects anything real.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

IDP_OIDC_PRIVATE_KEY = (STATE_DIR / "key.pem").read_text()
IDP_OIDC_ADAPTER = "harness.idp.adapter.OIDCAdapter"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    # Tracebacks of failed requests go to the log file the fixture names.
    "root": {"handlers": ["console"], "level": "WARNING"},
}
