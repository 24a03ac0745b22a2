"""Who the console's users are: single sign-on through OpenID Connect, passkeys, and
how long a session lasts (django-allauth does the protocols; ``identity`` the rules).

One identity provider is configured by the plain names (``SETTLE_OIDC_ISSUER`` and the
rest), with the id ``sso``; more are named in ``SETTLE_OIDC_PROVIDERS`` and each read from
the same names with its id in them (``SETTLE_OIDC_PARTNER_ISSUER`` for ``partner``).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from settle.settings_env import env_int, env_str
from settle.settings_security import HTTPS

# The one the plain names configure; its callback is /accounts/oidc/sso/login/callback/.
SETTLE_OIDC_DEFAULT_ID = "sso"
_ID = re.compile(r"[a-z][a-z0-9-]{0,29}")


@dataclass(frozen=True)
class OidcProvider:
    """One identity provider, as the environment configures it."""

    id: str
    issuer: str
    client_id: str
    client_secret: str
    label: str
    groups_claim: str
    allowed_groups: tuple[str, ...]


def _loopback(issuer: str) -> bool:
    """Whether the issuer's host is this machine (a test's identity provider)."""
    host = urlsplit(issuer).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _oidc_provider(provider_id: str, prefix: str, *, https: bool) -> OidcProvider | None:
    issuer = env_str(f"{prefix}_ISSUER", "").strip().rstrip("/")
    if not issuer:
        return None
    if not issuer.startswith(("https://", "http://")):
        raise ImproperlyConfigured(f"{prefix}_ISSUER={issuer!r} is not an http(s) URL")
    # Discovery, the keys that sign ID tokens and the token exchange all come from the
    # issuer: over plain HTTP anyone on the path could sign people in as anyone.
    if https and not issuer.startswith("https://") and not _loopback(issuer):
        raise ImproperlyConfigured(
            f"{prefix}_ISSUER={issuer!r}: SETTLE_HTTPS is on, so the issuer must be an "
            "https:// URL (http:// only on a loopback address)"
        )
    client_id = env_str(f"{prefix}_CLIENT_ID", "")
    secret = env_str(f"{prefix}_CLIENT_SECRET", "")
    if not client_id or not secret:
        raise ImproperlyConfigured(f"{prefix}_ISSUER is set: set {prefix}_CLIENT_ID and _SECRET")
    groups = env_str(f"{prefix}_ALLOWED_GROUPS", "")
    return OidcProvider(
        id=provider_id,
        issuer=issuer,
        client_id=client_id,
        client_secret=secret,
        label=env_str(f"{prefix}_LABEL", "Sign in with single sign-on"),
        groups_claim=env_str(f"{prefix}_GROUPS_CLAIM", "groups") or "groups",
        allowed_groups=tuple(g.strip() for g in groups.split(",") if g.strip()),
    )


def _oidc_providers(*, https: bool) -> tuple[OidcProvider, ...]:
    found = []
    plain = _oidc_provider(SETTLE_OIDC_DEFAULT_ID, "SETTLE_OIDC", https=https)
    if plain:
        found.append(plain)
    for provider_id in (p.strip() for p in env_str("SETTLE_OIDC_PROVIDERS", "").split(",")):
        if not provider_id:
            continue
        if not _ID.fullmatch(provider_id) or provider_id == SETTLE_OIDC_DEFAULT_ID:
            raise ImproperlyConfigured(
                f"SETTLE_OIDC_PROVIDERS: {provider_id!r} is not a lower-case name other than sso"
            )
        prefix = "SETTLE_OIDC_" + provider_id.upper().replace("-", "_")
        provider = _oidc_provider(provider_id, prefix, https=https)
        if provider is None:
            raise ImproperlyConfigured(
                f"SETTLE_OIDC_PROVIDERS names {provider_id}: set {prefix}_ISSUER"
            )
        found.append(provider)
    return tuple(found)


SETTLE_OIDC = _oidc_providers(https=HTTPS)
# With single sign-on on, password sign-in is for superusers alone (break-glass).
SETTLE_SSO_ENABLED = bool(SETTLE_OIDC)
# Directory groups to Settle roles (``identity.rolemap``), reviewed like code; read at
# start-up, so a bad file stops it with the line at fault.
_ROLE_MAP = env_str("SETTLE_OIDC_ROLE_MAP", "")
SETTLE_OIDC_ROLE_MAP = Path(_ROLE_MAP) if _ROLE_MAP else None
if SETTLE_OIDC_ROLE_MAP and not SETTLE_OIDC_ROLE_MAP.is_file():
    raise ImproperlyConfigured(f"SETTLE_OIDC_ROLE_MAP={_ROLE_MAP!r} is not a file")


def socialaccount_providers(providers: tuple[OidcProvider, ...]) -> dict[str, object]:
    """allauth's SOCIALACCOUNT_PROVIDERS for these identity providers."""
    return {
        "openid_connect": {
            # PKCE (S256) on every sign-in; the state is allauth's, the nonce Settle's
            # (identity.oidc), both kept in the session and good for one callback.
            "OAUTH_PKCE_ENABLED": True,
            "APPS": [
                {
                    "provider_id": p.id,
                    "name": p.label,
                    "client_id": p.client_id,
                    "secret": p.client_secret,
                    "settings": {"server_url": p.issuer, "fetch_userinfo": True},
                }
                for p in providers
            ],
        }
    }


SOCIALACCOUNT_PROVIDERS = socialaccount_providers(SETTLE_OIDC)
SOCIALACCOUNT_ADAPTER = "identity.adapters.SocialAccountAdapter"
ACCOUNT_ADAPTER = "identity.adapters.AccountAdapter"
# The first sign-in creates the user, from the directory's claims, with no form to fill.
SOCIALACCOUNT_AUTO_SIGNUP = True
# The subject identifier is the identity: never sign in to a local account, nor link to
# one, because its e-mail address matches (identity.adapters refuses the collision).
SOCIALACCOUNT_EMAIL_AUTHENTICATION = False
SOCIALACCOUNT_EMAIL_AUTHENTICATION_AUTO_CONNECT = False
SOCIALACCOUNT_EMAIL_VERIFICATION = "none"
SOCIALACCOUNT_STORE_TOKENS = False
SOCIALACCOUNT_QUERY_EMAIL = False
SOCIALACCOUNT_REQUESTS_TIMEOUT = env_int("SETTLE_OIDC_TIMEOUT_SECONDS", 5, minimum=1)
# Local accounts are made by `manage.py createsuperuser` and the admin, never by sign-up;
# a username signs in (the directory's users sign in through it, not here).
ACCOUNT_LOGIN_METHODS = {"username"}
ACCOUNT_SIGNUP_FIELDS = ["username*", "password1*"]
ACCOUNT_EMAIL_VERIFICATION = "none"
ACCOUNT_LOGOUT_ON_GET = False
ACCOUNT_SESSION_REMEMBER = True  # no checkbox: a session lasts its maximum age
ACCOUNT_PREVENT_ENUMERATION = True
# django-axes throttles password sign-in (settle.settings_security); allauth's own
# limits, kept in the cache, would count each failure a second time.
ACCOUNT_RATE_LIMITS = {"login_failed": None}

# Passkeys (allauth.mfa's WebAuthn, fido2 underneath: the library that will also verify
# signed approval decisions). No authenticator codes and no recovery codes: a lost
# passkey is replaced by a superuser removing it, after which its owner registers another.
MFA_SUPPORTED_TYPES = ["webauthn"]
MFA_PASSKEY_LOGIN_ENABLED = True
# A passkey stands for its owner only if its owner unlocked it (PIN, fingerprint):
# presence alone (a key left plugged in) is refused, at registration and at sign-in.
MFA_WEBAUTHN_USER_VERIFICATION = "required"
# The origin is checked against the host the browser reached, always.
MFA_WEBAUTHN_ALLOW_INSECURE_ORIGIN = False
# Who must have used a passkey in their session before the console, or the API through
# their session, serves them (identity.passkeys.PasskeyRequiredMiddleware): supervisors,
# approvers (anyone who may decide an approval), both, or nobody. Unset, it follows
# SETTLE_HTTPS as the other protections do: everyone who can decide an approval in
# production, nobody on the embedded default (plain http://127.0.0.1, password sign-in).
_PASSKEY_ROLES = ("supervisor", "approver")


def _require_passkey_for(*, https: bool) -> tuple[str, ...]:
    value = env_str("SETTLE_REQUIRE_PASSKEY_FOR", ",".join(_PASSKEY_ROLES) if https else "none")
    names = {name.strip() for name in value.split(",") if name.strip()}
    if names <= {"none"}:
        return ()
    if not names <= set(_PASSKEY_ROLES):
        raise ImproperlyConfigured(
            f"SETTLE_REQUIRE_PASSKEY_FOR={value!r}: name the roles it holds, comma separated, "
            "of supervisor, approver; or none"
        )
    return tuple(role for role in _PASSKEY_ROLES if role in names)


SETTLE_REQUIRE_PASSKEY_FOR = _require_passkey_for(https=HTTPS)

# How long a session lasts (identity.sessions): at most SETTLE_SESSION_MAX_AGE_MINUTES
# from sign-in, however busy (its expiry is set once, at sign-in: never slid by a
# request), and signed out after SETTLE_SESSION_IDLE_MINUTES without a request.
SETTLE_SESSION_MAX_AGE_MINUTES = env_int("SETTLE_SESSION_MAX_AGE_MINUTES", 12 * 60, minimum=1)
SETTLE_SESSION_IDLE_MINUTES = env_int("SETTLE_SESSION_IDLE_MINUTES", 30, minimum=1)
SESSION_COOKIE_AGE = SETTLE_SESSION_MAX_AGE_MINUTES * 60
SESSION_SAVE_EVERY_REQUEST = False
# allauth.usersessions lists a user's sessions, so a supervisor can end them; a row is
# written at sign-in only, never per request (no last-seen address or time).
USERSESSIONS_TRACK_ACTIVITY = False
