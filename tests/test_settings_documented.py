"""Every environment variable Settle reads has one row in docs/settings.md, and every row
names a variable Settle reads.

The code side is read from the source, not from ``os.environ`` at run time: the typed
helpers of ``settle/settings_env.py`` (``env_str``, ``env_int``, ...) and any direct
``os.environ`` / ``os.getenv`` read of a ``SETTLE_*`` name or of one of Django's
settings Settle takes from the environment. The docs side is every backticked name in
the first column of docs/settings.md's tables.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SETTINGS_PAGE = REPO / "docs" / "settings.md"

# The project's own code; tests/, bench/, clients/ and examples/ read variables of their
# own (the test database, a benchmark's options), which are not settings of Settle.
APPS = (
    "settle",
    "console",
    "identity",
    "monitoring",
    "recovery",
    "approvals",
    "audit",
    "policies",
    "webhooks",
    "common",
    "dbsql",
)
HELPERS = {"env_str", "env_int", "env_bool", "env_float", "env_list", "_generated_secret"}
DJANGO_NAMES = {
    "DATABASE_URL",
    "SECRET_KEY",
    "DEBUG",
    "ALLOWED_HOSTS",
    "CELERY_BROKER_URL",
    "LOG_LEVEL",
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "SECURE_SSL_REDIRECT",
    "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_HSTS_PRELOAD",
}
# `manage.py demo` hands the worker processes it starts their tokens through these;
# an operator never sets them, so they are not settings.
NOT_SETTINGS = {"SETTLE_HOST_TOKEN", "SETTLE_APPROVER_TOKEN"}
# Names built from a prefix: `_oidc_provider(provider_id, prefix)` in
# settle/settings_identity.py reads `f"{prefix}_ISSUER"` and its siblings once for the
# plain names (prefix `SETTLE_OIDC`) and once per identity provider named in
# SETTLE_OIDC_PROVIDERS (prefix `SETTLE_OIDC_<NAME>`, the name upper-cased). The suffixes
# are read from the code; only these two prefixes are written here.
DYNAMIC_PREFIXES = {"prefix": ("SETTLE_OIDC", "SETTLE_OIDC_<NAME>")}


def _is_setting(name: str) -> bool:
    return (name.startswith("SETTLE_") or name in DJANGO_NAMES) and name not in NOT_SETTINGS


def _callee(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return ast.unparse(func)
    return ""


def _names_of(arg: ast.expr, where: str) -> set[str]:
    """The variable name(s) one argument spells: a literal, or an f-string on a known prefix."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return {arg.value}
    if isinstance(arg, ast.JoinedStr):
        parts = []
        for value in arg.values:
            if isinstance(value, ast.Constant):
                parts.append(("", str(value.value)))
            elif isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name):
                placeholder = value.value.id
                assert placeholder in DYNAMIC_PREFIXES, (
                    f"{where}: a variable name built on {{{placeholder}}}; add what it can be "
                    "to DYNAMIC_PREFIXES in this test"
                )
                parts.append((placeholder, ""))
            else:
                raise AssertionError(f"{where}: a variable name this test cannot read")
        names = {""}
        for placeholder, text in parts:
            choices = DYNAMIC_PREFIXES[placeholder] if placeholder else (text,)
            names = {name + choice for name in names for choice in choices}
        return names
    raise AssertionError(f"{where}: a variable name this test cannot read: {ast.unparse(arg)}")


def code_variables() -> set[str]:
    found: set[str] = set()
    for app in APPS:
        for path in sorted((REPO / app).rglob("*.py")):
            where = str(path.relative_to(REPO))
            tree = ast.parse(path.read_text(), filename=where)
            for node in ast.walk(tree):
                arg: ast.expr | None = None
                if isinstance(node, ast.Call) and node.args:
                    callee = _callee(node)
                    if callee.rsplit(".", 1)[-1] in HELPERS or callee in {
                        "os.environ.get",
                        "os.getenv",
                        "environ.get",
                        "getenv",
                    }:
                        arg = node.args[0]
                elif isinstance(node, ast.Subscript) and ast.unparse(node.value) in {
                    "os.environ",
                    "environ",
                }:
                    arg = node.slice
                if arg is None:
                    continue
                if isinstance(arg, ast.Name) and where == "settle/settings_env.py":
                    continue  # the helpers themselves, reading the name they were given
                found |= {
                    name for name in _names_of(arg, f"{where}:{node.lineno}") if _is_setting(name)
                }
    return found


def documented_variables() -> set[str]:
    """The backticked names in the first column of every table of docs/settings.md."""
    found: set[str] = set()
    for line in SETTINGS_PAGE.read_text().splitlines():
        if not line.startswith("|") or line.startswith("| ---"):
            continue
        first = line.split("|")[1]
        found |= set(re.findall(r"`([A-Z][A-Z0-9_<>]*)`", first))
    return found


def test_every_setting_is_documented_and_every_documented_one_exists() -> None:
    code = code_variables()
    documented = documented_variables()
    assert code, "no variable found in the code: the scan is broken"
    undocumented = sorted(code - documented)
    unknown = sorted(documented - code)
    assert not undocumented and not unknown, (
        f"read by the code, no row in docs/settings.md: {undocumented}; "
        f"a row in docs/settings.md, read by no code: {unknown}"
    )


def test_the_scan_sees_names_built_on_a_prefix() -> None:
    code = code_variables()
    assert {"SETTLE_OIDC_ISSUER", "SETTLE_OIDC_<NAME>_ISSUER"} <= code
    assert {"SECRET_KEY", "SETTLE_AUDIT_KEY", "SETTLE_VAR_DIR", "LOG_LEVEL"} <= code
