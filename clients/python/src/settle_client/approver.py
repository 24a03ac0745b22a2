"""Approvers: read the exact action an approval is for, and decide it by its digest.

A decision names the digest the approver saw; Settle refuses it (``DigestMismatch``) if
the approval is for anything else. ``Approval.digest_verified`` recomputes the digest
from the parameters shown, so an app can tell that what it displays is what it signs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from settle_client import errors
from settle_client._http import AsyncTransport, SyncTransport
from settle_client._protocol import Call
from settle_client.canonical import CanonicalError, params_digest

APPROVALS = "/api/v1/approvals"


@dataclass(frozen=True)
class Approval:
    """Exactly what would be approved."""

    approval_id: str
    status: str
    operation_key: str
    action: str
    provider: str
    host: str
    params: dict[str, Any] | None
    params_digest: str
    permit_id: str | None
    expires_at: str | None
    # Which policy rule applied ("" none: one person) and what it still needs.
    rule: str = ""
    required: int = 1
    approvals: int = 0
    needed: str = ""

    @classmethod
    def of(cls, body: dict[str, Any]) -> Approval:
        try:
            fields = {name: body[name] for name in REQUIRED_FIELDS}
        except KeyError as exc:
            raise errors.ProtocolError(f"an approval without {exc}: {body}") from None
        return cls(**fields, **{name: body[name] for name in NEEDS if name in body})

    @property
    def digest_verified(self) -> bool:
        """The parameters shown digest to the digest a decision names."""
        if self.params is None:
            return False
        try:
            return params_digest(self.params) == self.params_digest
        except CanonicalError:
            return False


NEEDS = ("rule", "required", "approvals", "needed")
REQUIRED_FIELDS = [name for name in Approval.__dataclass_fields__ if name not in NEEDS]


@dataclass(frozen=True)
class Decided:
    approval_id: str
    status: str
    permit_id: str | None
    expires_at: str | None
    # A quorum still pending after this decision says so: "1 of 2 approvals".
    needed: str = ""


def _path(approval_id: str, endpoint: str = "") -> str:
    return f"{APPROVALS}/{quote(approval_id, safe='')}{endpoint}"


def _decision(approval: Approval, approve: bool, ttl_seconds: int, reason: str = "") -> Call:
    body: dict[str, Any] = {
        "decision": "approve" if approve else "deny",
        "ttl_seconds": ttl_seconds,
        "params_digest": approval.params_digest,
    }
    if reason:
        body["reason"] = reason
    # Deciding twice answers already_decided: safe to send again on a broken connection.
    return Call("POST", _path(approval.approval_id, "/decision"), body)


def _decided(body: dict[str, Any]) -> Decided:
    return Decided(
        str(body.get("approval_id")),
        str(body.get("status")),
        body.get("permit_id"),
        body.get("expires_at"),
        str(body.get("needed") or ""),
    )


class Approver:
    """An approver credential (``settle_apr_…``) or any bearer token allowed to decide."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.http = SyncTransport(
            base_url, token, timeout=timeout, retries=retries, transport=transport
        )

    def approval(self, approval_id: str) -> Approval:
        return Approval.of(self.http.call(Call("GET", _path(approval_id))))

    def decide(
        self, approval: Approval, *, approve: bool, ttl_seconds: int = 300, reason: str = ""
    ) -> Decided:
        """Decide ``approval`` as read: the decision names the digest it showed."""
        return _decided(self.http.call(_decision(approval, approve, ttl_seconds, reason)))

    def approve(self, approval_id: str, *, ttl_seconds: int = 300) -> Decided:
        """Read the approval, then approve exactly that."""
        return self.decide(self.approval(approval_id), approve=True, ttl_seconds=ttl_seconds)

    def approve_digest(
        self, approval_id: str, *, params_digest: str, ttl_seconds: int = 300
    ) -> Decided:
        """Approve without reading the approval first, naming a digest computed elsewhere.

        For an approver shown the params by other means (``settle_client.params_digest``
        of them): Settle refuses the decision (``DigestMismatch``) unless it is this
        approval's digest.
        """
        body = {"decision": "approve", "ttl_seconds": ttl_seconds, "params_digest": params_digest}
        return _decided(self.http.call(Call("POST", _path(approval_id, "/decision"), body)))

    def deny(self, approval_id: str, *, reason: str = "") -> Decided:
        return self.decide(self.approval(approval_id), approve=False, reason=reason)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Approver:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncApprover:
    """``Approver`` for asyncio."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.http = AsyncTransport(
            base_url, token, timeout=timeout, retries=retries, transport=transport
        )

    async def approval(self, approval_id: str) -> Approval:
        return Approval.of(await self.http.call(Call("GET", _path(approval_id))))

    async def decide(
        self, approval: Approval, *, approve: bool, ttl_seconds: int = 300, reason: str = ""
    ) -> Decided:
        return _decided(await self.http.call(_decision(approval, approve, ttl_seconds, reason)))

    async def approve(self, approval_id: str, *, ttl_seconds: int = 300) -> Decided:
        approval = await self.approval(approval_id)
        return await self.decide(approval, approve=True, ttl_seconds=ttl_seconds)

    async def deny(self, approval_id: str, *, reason: str = "") -> Decided:
        return await self.decide(await self.approval(approval_id), approve=False, reason=reason)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncApprover:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
