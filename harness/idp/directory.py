"""The directory file: the people who may sign in at the IdP, and the faults of its tokens.

One JSON file in the IdP's state folder. The tests write it (``harness.oidc.Directory``,
one writer per IdP, as each xdist worker has an IdP of its own) and the IdP reads it at
every request (:func:`directory_read`), so a change counts from the next request on::

    {
      "people": {"alice": {"password": "…", "email": "alice@example.com",
                           "email_verified": true, "name": "Alice",
                           "groups": ["ops"], "sub": null}},
      "groups_claim": "groups",
      "faults": {"nonce": "wrong", "expired": true, "issuer": "http://elsewhere.example"}
    }

This module imports nothing of Django (nor of Settle): the test process (Settle's settings)
and the IdP process (its own) both use it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

DIRECTORY_FILE = "directory.json"
CLIENTS_FILE = "clients.json"
# The faults an ID token can carry.
FAULTS = ("nonce", "expired", "issuer")


def empty() -> dict[str, Any]:
    return {"people": {}, "groups_claim": "groups", "faults": {}}


def json_write(path: Path, data: Any) -> None:
    """Write ``data`` whole: the IdP reads the file at any moment, never a half of it."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(data, indent=2, sort_keys=True), "utf-8")
    os.replace(partial, path)


def json_read(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        return default


def directory_read(state: Path) -> dict[str, Any]:
    """The directory as it stands now (empty if no test wrote one yet)."""
    return {**empty(), **json_read(state / DIRECTORY_FILE, {})}
