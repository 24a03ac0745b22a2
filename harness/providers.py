"""The "outside tools": providers that perform effects, as tests and worker processes use them.

Settle's adapters only ever *read* these records (see ``recovery.adapters``); everything that
*writes* them lives here, so that tests and crash-test worker processes produce exactly the
formats a real provider would. Standard library plus ``common.canonical`` only, so this
module is importable without Django being set up.

Three providers:

* SQLite: ``orders`` + ``receipts`` rows committed in one transaction
  (:func:`sqlite_provider_commit`); :func:`sqlite_provider_tamper` damages them for tests.
  To restore a tampered record, commit it again: a commit replaces both rows.
* Journal: a JSON Lines file of checksummed lines (:func:`journal_append`), plus
  :func:`journal_append_raw` for garbage.
* HTTP: ``harness/http_provider.py`` run as a real process
  (:func:`http_provider_start`), driven with :func:`http_provider_perform` and
  :func:`http_provider_control`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import selectors
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common.canonical import (
    canonical_dumps,
    canonical_params,
    params_digest,
    sha256_digest,
    strict_loads,
)

StrPath = str | os.PathLike[str]

HTTP_PROVIDER_SCRIPT = Path(__file__).with_name("http_provider.py")
SQLITE_TAMPER_MODES = (
    "delete_receipt",
    "delete_order",
    "bad_json",
    "wrong_stored_digest",
    "other_params",
    "bad_status",
    "huge_created_at",
)

_SQLITE_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS orders ("
    "operation_key TEXT PRIMARY KEY, reference TEXT NOT NULL, "
    "status TEXT NOT NULL, created_at {created_at} NOT NULL)",
    "CREATE TABLE IF NOT EXISTS receipts ("
    "operation_key TEXT PRIMARY KEY, params_json TEXT NOT NULL, params_digest TEXT NOT NULL)",
)


def _now() -> str:
    return datetime.now(UTC).isoformat()


def digest_of(params: dict[str, Any]) -> str:
    """The params digest Settle computes for ``params`` (canonical JSON, sha256)."""
    return params_digest(canonical_params(params))


# --------------------------------------------------------------------------- sqlite


def _sqlite_connect(path: StrPath) -> sqlite3.Connection:
    # Autocommit mode, so the explicit BEGIN IMMEDIATE below is the only transaction.
    return sqlite3.connect(os.fspath(path), timeout=10.0, isolation_level=None)


def sqlite_provider_init(path: StrPath, *, created_at: str = "TEXT") -> None:
    """Create the provider's ``orders`` and ``receipts`` tables (idempotent).

    ``created_at``: the column's declared type (a provider may keep it as an INTEGER).
    """
    connection = _sqlite_connect(path)
    try:
        for statement in _SQLITE_SCHEMA:
            connection.execute(statement.format(created_at=created_at))
    finally:
        connection.close()


def sqlite_provider_commit(
    path: StrPath,
    *,
    operation_key: str,
    params: dict[str, Any],
    reference: str,
    status: str = "committed",
    created_at: str | None = None,
    replace: bool = True,
) -> str:
    """Perform the effect: write the order and its exact-parameter receipt in ONE transaction.

    Returns the params digest stored in the receipt. With ``replace`` (the default) an
    existing record for the key is overwritten, which is how tests restore a tampered
    record; with ``replace=False`` a second commit for the key raises
    ``sqlite3.IntegrityError``, like a provider that refuses duplicates.
    """
    params_json = canonical_params(params)
    digest = params_digest(params_json)
    verb = "INSERT OR REPLACE" if replace else "INSERT"
    connection = _sqlite_connect(path)
    try:
        connection.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SQLITE_SCHEMA:
                connection.execute(statement.format(created_at="TEXT"))
            connection.execute(
                f"{verb} INTO orders (operation_key, reference, status, created_at) "
                "VALUES (?, ?, ?, ?)",
                (operation_key, reference, status, created_at or _now()),
            )
            connection.execute(
                f"{verb} INTO receipts (operation_key, params_json, params_digest) "
                "VALUES (?, ?, ?)",
                (operation_key, params_json, digest),
            )
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")
    finally:
        connection.close()
    return digest


def sqlite_provider_tamper(
    path: StrPath, operation_key: str, mode: str, *, params: dict[str, Any] | None = None
) -> None:
    """Damage the record for ``operation_key`` the way ``mode`` says (tests only).

    Modes: ``delete_receipt``, ``delete_order``, ``bad_json`` (unparsable params_json, digest
    untouched), ``wrong_stored_digest`` (digest no longer matches params_json),
    ``other_params`` (a consistent receipt for ``params`` or ``{"tampered": true}``) and
    ``bad_status`` (order status ``"pending"``) and ``huge_created_at`` (the order's
    ``created_at`` set to the integer 2^53, kept as one where the column's type allows:
    see ``sqlite_provider_init``). Restore with :func:`sqlite_provider_commit`.
    """
    if mode not in SQLITE_TAMPER_MODES:
        raise ValueError(f"unknown tamper mode {mode!r}; use one of {SQLITE_TAMPER_MODES}")
    key = (operation_key,)
    statements: list[tuple[str, tuple[Any, ...]]]
    if mode == "delete_receipt":
        statements = [("DELETE FROM receipts WHERE operation_key = ?", key)]
    elif mode == "delete_order":
        statements = [("DELETE FROM orders WHERE operation_key = ?", key)]
    elif mode == "bad_json":
        statements = [
            ("UPDATE receipts SET params_json = ? WHERE operation_key = ?", ("{not json", *key))
        ]
    elif mode == "wrong_stored_digest":
        statements = [
            (
                "UPDATE receipts SET params_digest = ? WHERE operation_key = ?",
                ("sha256:" + "0" * 64, *key),
            )
        ]
    elif mode == "other_params":
        other = canonical_params(params if params is not None else {"tampered": True})
        statements = [
            (
                "UPDATE receipts SET params_json = ?, params_digest = ? WHERE operation_key = ?",
                (other, params_digest(other), *key),
            )
        ]
    elif mode == "huge_created_at":
        statements = [("UPDATE orders SET created_at = ? WHERE operation_key = ?", (2**53, *key))]
    else:  # bad_status
        statements = [("UPDATE orders SET status = 'pending' WHERE operation_key = ?", key)]
    connection = _sqlite_connect(path)
    try:
        connection.execute("BEGIN IMMEDIATE")
        for sql, args in statements:
            if connection.execute(sql, args).rowcount != 1:
                connection.execute("ROLLBACK")
                raise LookupError(f"no row to tamper with for {operation_key!r} ({mode})")
        connection.execute("COMMIT")
    finally:
        connection.close()


# --------------------------------------------------------------------------- journal


def journal_checksum(record: dict[str, Any]) -> str:
    """``sha256:`` + hex of the canonical JSON of a journal line without its checksum."""
    return sha256_digest(canonical_dumps({k: v for k, v in record.items() if k != "checksum"}))


def _max_seq(handle: Any) -> int:
    highest = 0
    handle.seek(0)
    for line in handle:
        try:
            record = strict_loads(line)
        except ValueError:
            continue
        seq = record.get("seq") if isinstance(record, dict) else None
        if isinstance(seq, int) and not isinstance(seq, bool):
            highest = max(highest, seq)
    return highest


def _append_synced(handle: Any, data: bytes) -> None:
    handle.seek(0, os.SEEK_END)
    handle.write(data)
    handle.flush()
    os.fsync(handle.fileno())


def journal_append(
    path: StrPath,
    *,
    operation_key: str,
    params_digest: str,
    reference: str,
    status: str = "committed",
    seq: int | None = None,
    committed_at: str | None = None,
    corrupt_checksum: bool = False,
) -> dict[str, Any]:
    """Append one checksummed line (fsynced) and return it; ``seq`` defaults to max + 1.

    An exclusive ``flock`` covers reading the highest seq and appending, so concurrent
    worker processes never hand out the same seq. ``corrupt_checksum`` writes a checksum
    that does not match the line (tests only).
    """
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            record: dict[str, Any] = {
                "seq": seq if seq is not None else _max_seq(handle) + 1,
                "operation_key": operation_key,
                "params_digest": params_digest,
                "reference": reference,
                "status": status,
                "committed_at": committed_at or _now(),
            }
            checksum = journal_checksum(record)
            if corrupt_checksum:
                checksum = sha256_digest(checksum.encode("utf-8"))
            record["checksum"] = checksum
            _append_synced(handle, canonical_dumps(record) + b"\n")
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    return record


def journal_append_raw(path: StrPath, text: str | bytes) -> None:
    """Append ``text`` verbatim as one line (a newline is added if missing), fsynced."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    if not data.endswith(b"\n"):
        data += b"\n"
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            _append_synced(handle, data)
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


# --------------------------------------------------------------------------- http


# Test helpers talk to a local process: never through a proxy from the environment.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for_ready(process: subprocess.Popen[str], deadline: float) -> bool:
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
                continue
            line = process.stdout.readline()
            if line == "":  # EOF: the process exited (e.g. the port was taken)
                return False
            if line.strip() == "ready":
                return True
    return False


def http_provider_start(
    tmp_path: StrPath,
    secret: str,
    *,
    store: StrPath | None = None,
    startup_timeout: float = 15.0,
) -> tuple[subprocess.Popen[str], str]:
    """Start ``http_provider.py`` on a free port; return ``(process, base_url)``.

    The store defaults to ``tmp_path/http_provider_store.json``, so starting again with the
    same ``tmp_path`` after :func:`http_provider_stop` keeps the effects. Server logs go to
    ``tmp_path/http_provider.log``. Stop it with :func:`http_provider_stop`.
    """
    directory = Path(tmp_path)
    store_path = Path(store) if store is not None else directory / "http_provider_store.json"
    for _attempt in range(5):
        port = _free_port()
        with open(directory / "http_provider.log", "ab") as log:
            process = subprocess.Popen(
                [
                    sys.executable,
                    str(HTTP_PROVIDER_SCRIPT),
                    "--port",
                    str(port),
                    "--secret",
                    secret,
                    "--store",
                    str(store_path),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        if _wait_for_ready(process, time.monotonic() + startup_timeout):
            return process, f"http://127.0.0.1:{port}"
        http_provider_stop(process)
    raise RuntimeError(f"http_provider.py did not become ready; see {directory}/http_provider.log")


def http_provider_stop(process: subprocess.Popen[str]) -> None:
    """Terminate a server started by :func:`http_provider_start` and reap it."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
    if process.stdout is not None:
        with contextlib.suppress(OSError):
            process.stdout.close()


def _post_json(url: str, payload: dict[str, Any], timeout: float) -> Any:
    request = urllib.request.Request(
        url,
        data=json.dumps(payload).encode("utf-8"),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with _DIRECT.open(request, timeout=timeout) as response:
        return json.loads(response.read())


def _effect_url(base_url: str, operation_key: str) -> str:
    return f"{base_url.rstrip('/')}/effects/{urllib.parse.quote(operation_key, safe='')}"


def http_provider_perform(
    base_url: str,
    *,
    operation_key: str,
    params_digest: str,
    reference: str,
    status: str = "committed",
    timeout: float = 10.0,
) -> dict[str, Any]:
    """Perform an effect on the HTTP provider; returns the stored record (with seq)."""
    record = _post_json(
        _effect_url(base_url, operation_key),
        {"params_digest": params_digest, "reference": reference, "status": status},
        timeout,
    )
    assert isinstance(record, dict)
    return record


def http_provider_control(base_url: str, mode: str, *, delay: float | None = None) -> None:
    """Change how the provider answers ``GET /effects/...`` (see ``harness.http_provider.MODES``).

    ``delay`` sets how long ``slow`` sleeps before answering (default 10 s).
    """
    payload: dict[str, Any] = {"mode": mode}
    if delay is not None:
        payload["delay"] = delay
    _post_json(f"{base_url.rstrip('/')}/control", payload, 10.0)


def http_provider_history(base_url: str, operation_key: str) -> list[dict[str, Any]]:
    """Every effect the provider performed for the key, oldest first (duplicate detection)."""
    url = f"{base_url.rstrip('/')}/history/{urllib.parse.quote(operation_key, safe='')}"
    with _DIRECT.open(url, timeout=10.0) as response:
        history = json.loads(response.read())
    assert isinstance(history, list)
    return history


def provider_perform(
    kind: str,
    *,
    path: StrPath = "",
    url: str = "",
    operation_key: str,
    params: dict[str, Any],
    reference: str,
    params_digest: str | None = None,
    status: str = "committed",
    replace: bool = True,
    corrupt_checksum: bool = False,
) -> dict[str, Any]:
    """Perform the effect at a provider of ``kind``, as that provider's own tool does.

    Returns what the provider stored: ``params_digest``, and ``seq`` where the provider
    numbers its records (journal, http). ``params_digest``: what the journal or HTTP
    record claims, when a test wants it to differ from ``params``' own digest (SQLite
    derives its receipt from ``params``). ``replace`` and ``corrupt_checksum`` are the
    SQLite and journal writers' own options.
    """
    digest = params_digest or digest_of(params)
    if kind == "sqlite":
        stored = sqlite_provider_commit(
            path,
            operation_key=operation_key,
            params=params,
            reference=reference,
            status=status,
            replace=replace,
        )
        return {"params_digest": stored}
    if kind == "journal":
        line = journal_append(
            path,
            operation_key=operation_key,
            params_digest=digest,
            reference=reference,
            status=status,
            corrupt_checksum=corrupt_checksum,
        )
        return {"params_digest": digest, "seq": line["seq"]}
    record = http_provider_perform(
        url, operation_key=operation_key, params_digest=digest, reference=reference, status=status
    )
    return {"params_digest": digest, "seq": record.get("seq")}
