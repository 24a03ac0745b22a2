"""Credential tokens: what one looks like, how it is kept, and which prefix names which kind.

token
    A bearer token is its kind's prefix (``PREFIXES``: ``sth_`` a host's, ``sta_`` an
    approver's) and 32 random bytes, base64url. It is shown once and never stored.
token_hash
    What is stored instead: ``sha256:`` and the hex SHA-256 of the token's UTF-8. A token
    is found by its hash, so a row read from the database lets no one call the API.

The prefix lets the API look a token up in its own kind's table alone (``token_kind``).
Creating, disabling and rotating a credential are its app's services, which audit them.
"""

from __future__ import annotations

import secrets

from common.canonical import sha256_digest

HOST_TOKEN_PREFIX = "sth_"
APPROVER_TOKEN_PREFIX = "sta_"
# A party's one-time passkey enrolment link (never a credential of the API).
ENROLMENT_TOKEN_PREFIX = "ste_"
PREFIXES = {
    "host": HOST_TOKEN_PREFIX,
    "approver": APPROVER_TOKEN_PREFIX,
    "enrolment": ENROLMENT_TOKEN_PREFIX,
}


def token_hash(token: str) -> str:
    """What is stored of ``token``: the only form Settle keeps."""
    return sha256_digest(token.encode("utf-8"))


def token_new(kind: str) -> tuple[str, str]:
    """A bearer token of ``kind`` (``host``, ``approver``, ``enrolment``), and its hash."""
    token = PREFIXES[kind] + secrets.token_urlsafe(32)
    return token, token_hash(token)


def token_kind(token: str) -> str:
    """The kind of credential whose table holds ``token``.

    Any token without an approver's prefix is looked for among the hosts, where an
    unknown one is simply not found.
    """
    return "approver" if token.startswith(APPROVER_TOKEN_PREFIX) else "host"
