"""settle-mcp's configuration: a TOML file a team reviews (docs/mcp-gateway.md).

Every error names the file's line it is about (``ConfigError.line``), found by looking
the table or key up in the text: ``tomllib`` keeps no positions.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ADDED_KEY = "settle_key"  # the argument the gateway adds to a tool's schema (key = "added")


class ConfigError(Exception):
    """A configuration the gateway refuses; ``line`` is 1-based (0: the file as a whole)."""

    def __init__(self, message: str, *, path: Path, line: int = 0) -> None:
        self.path, self.line, self.message = path, line, message
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class Upstream:
    name: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class GatedTool:
    """One gated tool: a call becomes the Settle operation ``key`` / ``action`` / ``provider``."""

    name: str
    upstream: str
    provider: str
    action: str
    key_argument: str  # the agent's argument holding the key, or ADDED_KEY
    key_added: bool
    party_argument: str = ""
    evidence_tool: str = ""
    line: int = 0


@dataclass(frozen=True)
class Config:
    path: Path
    text: str
    settle_url: str
    token_env: str
    console_url: str
    approval_wait_seconds: float
    upstreams: dict[str, Upstream]
    gated: dict[str, GatedTool]

    def token(self) -> str:
        token = os.environ.get(self.token_env, "")
        if not token:
            raise ConfigError(
                f"the host token's variable {self.token_env} is not set",
                path=self.path,
                line=locate(self.text, "settle", "token_env"),
            )
        return token

    def line_of(self, table: str, key: str | None = None) -> int:
        return locate(self.text, table, key)


def locate(text: str, table: str, key: str | None = None) -> int:
    """The line of ``[table]`` (``a.b`` matches ``[a.b]``, ``[a."b"]``), or of ``key = ``
    inside it; 0 if not found."""
    parts = table.split(".")
    header = r"\s*\.\s*".join(
        rf"(?:{re.escape(p)}|\"{re.escape(p)}\"|'{re.escape(p)}')" for p in parts
    )
    header_re = re.compile(rf"^\s*\[\s*{header}\s*\]\s*(?:#.*)?$")
    key_re = re.compile(rf"^\s*(?:{re.escape(key)}|\"{re.escape(key)}\")\s*=") if key else None
    inside = False
    for number, line in enumerate(text.splitlines(), start=1):
        if header_re.match(line):
            if key_re is None:
                return number
            inside = True
            continue
        if inside and re.match(r"^\s*\[", line):
            inside = False
        if inside and key_re is not None and key_re.match(line):
            return number
    return 0 if key is None else locate(text, table)


def _text(raw: dict[str, Any], key: str, where: str, fail: Any, *, required: bool = True) -> str:
    value = raw.get(key, "")
    if not isinstance(value, str) or (required and not value):
        fail(f"{where}: {key} must be a non-empty string", where, key)
    return str(value)


def _strings(raw: dict[str, Any], key: str, where: str, fail: Any) -> dict[str, str]:
    value = raw.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        fail(f"{where}: {key} must be a table of strings", where, key)
    return dict(value)


def load(path: Path) -> Config:
    """Read and check the file's shape (not the upstreams: ``settle-mcp check`` does)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", path=path) from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = re.search(r"line (\d+)", str(exc))
        raise ConfigError(str(exc), path=path, line=int(found[1]) if found else 0) from None

    def fail(message: str, table: str, key: str | None = None) -> None:
        raise ConfigError(message, path=path, line=locate(text, table, key))

    settle = raw.get("settle")
    if not isinstance(settle, dict):
        fail("a [settle] table with url and token_env is required", "settle")
        raise AssertionError  # for the type checker: fail raised
    url = _text(settle, "url", "settle", fail).rstrip("/")
    token_env = _text(settle, "token_env", "settle", fail)
    console = _text(settle, "console_url", "settle", fail, required=False).rstrip("/") or url
    wait = settle.get("approval_wait_seconds", 600)
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait <= 86400:
        fail(
            "settle: approval_wait_seconds must be a number of seconds, 0 to 86400",
            "settle",
            "approval_wait_seconds",
        )

    upstreams: dict[str, Upstream] = {}
    for name, spec in dict(raw.get("upstreams") or {}).items():
        where = f"upstreams.{name}"
        if not isinstance(spec, dict):
            fail(f"{where} must be a table", where)
        if bool(spec.get("command")) == bool(spec.get("url")):
            fail(f"{where}: give either command (stdio) or url (Streamable HTTP)", where)
        args = spec.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            fail(f"{where}: args must be a list of strings", where, "args")
        upstreams[name] = Upstream(
            name=name,
            command=_text(spec, "command", where, fail, required=False),
            args=tuple(args),
            env=_strings(spec, "env", where, fail),
            cwd=_text(spec, "cwd", where, fail, required=False) or None,
            url=_text(spec, "url", where, fail, required=False),
            headers=_strings(spec, "headers", where, fail),
        )
    if not upstreams:
        fail("at least one [upstreams.NAME] table is required", "upstreams")

    gated: dict[str, GatedTool] = {}
    for name, spec in dict(raw.get("gated") or {}).items():
        where = f"gated.{name}"
        if not isinstance(spec, dict):
            fail(f"{where} must be a table", where)
        upstream = _text(spec, "upstream", where, fail)
        if upstream not in upstreams:
            fail(f"{where}: no upstream named {upstream!r}", where, "upstream")
        has_argument, key = "key_argument" in spec, spec.get("key")
        if has_argument == (key is not None):
            fail(f'{where}: give key_argument = "ARG" or key = "added"', where)
        if key is not None and key != "added":
            fail(f'{where}: key may only be "added" (or use key_argument)', where, "key")
        gated[name] = GatedTool(
            name=name,
            upstream=upstream,
            provider=_text(spec, "provider", where, fail),
            action=_text(spec, "action", where, fail),
            key_argument=_text(spec, "key_argument", where, fail) if has_argument else ADDED_KEY,
            key_added=not has_argument,
            party_argument=_text(spec, "party_argument", where, fail, required=False),
            evidence_tool=_text(spec, "evidence_tool", where, fail, required=False),
            line=locate(text, where),
        )
    return Config(
        path=path,
        text=text,
        settle_url=url,
        token_env=token_env,
        console_url=console,
        approval_wait_seconds=float(wait),
        upstreams=upstreams,
        gated=gated,
    )
