"""An approval's link for its customer: a token that names one approval, and proves it.

token
    base64url (no padding) of the approval's 16 UUID bytes followed by the first 16
    bytes of an HMAC-SHA256 of its id under the project's secret
    (``django.utils.crypto.salted_hmac``, salt ``settle.approval-link``): 43 characters,
    128 unguessable bits. Nothing is stored, so the link can be given again (the
    ``approval.opened`` webhook, the API's answers) and never sits in a table; it is
    single-purpose because it names one approval, and dies with that approval's pending
    state. Rotating ``SECRET_KEY`` voids every link given.
URL
    ``{SETTLE_CUSTOMER_URL}/approve/#<token>``: in the fragment, the token never reaches
    an access log or a ``Referer``; the page's script sends it in POST bodies only.

It lives in the bottom layer because the host API (``recovery``) and the webhooks answer
with the link, and the customer pages (``customers.links``) read it back.
"""

from __future__ import annotations

import base64
import binascii
import uuid

from django.conf import settings
from django.utils.crypto import constant_time_compare, salted_hmac

SALT = "settle.approval-link"
TOKEN_LENGTH = 43  # 32 bytes, base64url without padding
PATH = "/approve/"


def _mac(approval_id: uuid.UUID) -> bytes:
    return salted_hmac(SALT, approval_id.hex, algorithm="sha256").digest()[:16]


def approval_link_token(approval_id: uuid.UUID | str) -> str:
    """The token of ``approval_id``'s link (the same every time it is asked)."""
    approval_id = uuid.UUID(str(approval_id))
    raw = approval_id.bytes + _mac(approval_id)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def approval_for_token(token: str) -> uuid.UUID | None:
    """The approval a token names, or None for anything that is not a token Settle gave."""
    if not isinstance(token, str) or len(token) != TOKEN_LENGTH or not token.isascii():
        return None
    try:
        raw = base64.urlsafe_b64decode(token + "=")
    except (binascii.Error, ValueError):
        return None
    if len(raw) != 32:
        return None
    approval_id = uuid.UUID(bytes=raw[:16])
    if not constant_time_compare(raw[16:], _mac(approval_id)):
        return None
    return approval_id


def approval_link_url(approval_id: uuid.UUID | str) -> str:
    """The link a host gives its customer for ``approval_id``."""
    return f"{settings.SETTLE_CUSTOMER_URL}{PATH}#{approval_link_token(approval_id)}"
