"""The settings' building blocks: where Settle keeps its files, and the typed helpers
that read the environment.

A bad value stops start-up with a message naming the variable, rather than surfacing
later as a confusing runtime error.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
# The console app beside this project package, in a checkout and in a wheel alike.
CONSOLE_DIR = BASE_DIR / "console"
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
        # Written whole under a name of this process's own, then linked into place: the
        # processes of a first start (web workers, Celery, beat) race here, and none may
        # read the file before its secret is in it. The first link wins; the rest read it.
        draft = path.with_name(f".{filename}.{os.getpid()}")
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(50))
        try:
            os.link(draft, path)
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    value = path.read_text().strip()
    if not value:
        raise ImproperlyConfigured(f"{path} is empty: delete it, or set {name}")
    return value
