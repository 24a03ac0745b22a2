"""The SQLite order-database adapter: the provider's ``orders`` and ``receipts`` tables.

The database is opened read-only (``mode=ro``, ``query_only``): Settle never writes to a
provider's record.
"""

from __future__ import annotations

import sqlite3
import urllib.parse
from typing import Any

from common.canonical import CanonicalError, canonical_params, params_digest, strict_loads
from recovery.adapters.base import (
    ABSENT,
    LookupResult,
    ProviderConfig,
    corrupt,
    digest_verdict,
    record_problem,
    unavailable,
    verdict_result,
)


def _sqlite_text(value: Any) -> str | None:
    """Column value as text, or ``None`` when it is not valid UTF-8 text."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


def sqlite_lookup(config: ProviderConfig, operation_key: str, expected: str) -> LookupResult:
    return sqlite_lookup_many(config, {operation_key: expected})[operation_key]


# Keys per query: well below SQLite's limit on bound parameters (999 before 3.32).
SQLITE_BATCH = 500


def sqlite_lookup_many(config: ProviderConfig, wanted: dict[str, str]) -> dict[str, LookupResult]:
    """Read ``orders`` and ``receipts`` for the keys in one read transaction, read-only.

    The provider commits both rows in one transaction, so half a pair (or a receipt whose
    digest does not match its own ``params_json``) means the record was damaged.
    """
    if not config.path:
        failed = unavailable("No SQLite path is configured for this provider.", error="no_path")
        return dict.fromkeys(wanted, failed)
    uri = f"file:{urllib.parse.quote(config.path)}?mode=ro"
    try:
        connection = sqlite3.connect(
            uri, uri=True, timeout=config.timeout_seconds, isolation_level=None
        )
    except sqlite3.Error as exc:
        failed = unavailable(
            f"The provider database could not be opened ({exc}).", error=str(exc), path=config.path
        )
        return dict.fromkeys(wanted, failed)
    # Text is read as bytes (below); a key's rows are found by its UTF-8 bytes.
    by_bytes = {key.encode("utf-8"): key for key in wanted}
    orders: dict[str, tuple[Any, ...]] = {}
    receipts: dict[str, tuple[Any, ...]] = {}
    try:
        # Text is read as bytes so that invalid UTF-8 is "corrupt", not a driver error.
        connection.text_factory = bytes
        connection.execute("PRAGMA query_only = ON")
        connection.execute("BEGIN")
        keys = list(wanted)
        for start in range(0, len(keys), SQLITE_BATCH):
            chunk = keys[start : start + SQLITE_BATCH]
            marks = ", ".join("?" * len(chunk))
            for row in connection.execute(
                "SELECT operation_key, reference, status, created_at FROM orders "
                f"WHERE operation_key IN ({marks})",
                chunk,
            ):
                _first_row(orders, by_bytes, row)
            for row in connection.execute(
                "SELECT operation_key, params_json, params_digest FROM receipts "
                f"WHERE operation_key IN ({marks})",
                chunk,
            ):
                _first_row(receipts, by_bytes, row)
        connection.execute("COMMIT")
    except sqlite3.Error as exc:
        failed = unavailable(
            f"The provider database could not be read ({exc}).", error=str(exc), path=config.path
        )
        return dict.fromkeys(wanted, failed)
    finally:
        connection.close()
    return {
        key: _sqlite_verdict(key, expected, orders.get(key), receipts.get(key))
        for key, expected in wanted.items()
    }


def _first_row(
    rows: dict[str, tuple[Any, ...]], by_bytes: dict[bytes, str], row: tuple[Any, ...]
) -> None:
    key = by_bytes.get(row[0]) if isinstance(row[0], bytes) else None
    if key is not None:
        rows.setdefault(key, row)


def _sqlite_verdict(
    operation_key: str,
    expected: str,
    order_row: tuple[Any, ...] | None,
    receipt_row: tuple[Any, ...] | None,
) -> LookupResult:
    order = (
        None
        if order_row is None
        else dict(
            zip(("operation_key", "reference", "status", "created_at"), order_row, strict=True)
        )
    )
    receipt = (
        None
        if receipt_row is None
        else dict(zip(("operation_key", "params_json", "params_digest"), receipt_row, strict=True))
    )
    raw: dict[str, Any] = {"order": order, "receipt": receipt}
    if order is None and receipt is None:
        return verdict_result(
            ABSENT, "The provider database has no order and no receipt for this key.", raw
        )
    if order is None:
        return corrupt("The provider database has a receipt but no order for this key.", raw)
    if receipt is None:
        return corrupt("The provider database has an order but no receipt for this key.", raw)

    texts = {name: _sqlite_text(value) for name, value in (*order.items(), *receipt.items())}
    for name in ("reference", "status", "params_json", "params_digest"):
        if texts[name] is None:
            return corrupt(f"The provider's {name} column does not hold UTF-8 text.", raw)
    reference, status = str(texts["reference"]), str(texts["status"])
    params_json, stored_digest = str(texts["params_json"]), str(texts["params_digest"])

    record = {"params_digest": stored_digest, "reference": reference, "status": status}
    problem = record_problem(record, "provider's order")
    if problem is not None:
        return corrupt(problem, raw)
    try:
        recomputed = params_digest(canonical_params(strict_loads(params_json)))
    except CanonicalError as exc:
        return corrupt(f"The provider's receipt holds unusable params_json ({exc.message}).", raw)
    if recomputed != stored_digest:
        return corrupt(
            "The provider's receipt digest does not match its own params_json "
            f"(stored {stored_digest}, recomputed {recomputed}).",
            raw,
        )
    return digest_verdict(record, expected, raw, "provider's order")
