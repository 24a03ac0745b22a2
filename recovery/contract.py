"""The host API's contract: every request and response body, defined once.

The views validate request bodies with these models (after ``common.canonical.strict_loads``,
which refuses duplicate keys and non-finite numbers first), build every response from
them, and ``recovery.openapi`` generates the OpenAPI document from them. A validation
error becomes one of the API's stable error codes in one place: ``refusal``.

Models are strict: no coercion (``"5"`` is not 5, ``true`` is not 1; 5.0 is 5, as JSON
has one kind of number) and no unknown fields. Text is valid Unicode without NUL;
patterns match the whole value.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StringConstraints,
    ValidationError,
)
from pydantic.json_schema import SkipJsonSchema

from approvals.services.approvals import MAX_TTL_SECONDS
from common.canonical import (
    MAX_RESULT_BYTES,
    MAX_SAFE_INTEGER,
    CanonicalError,
    canonical_params,
)
from common.errors import ErrorCode, SettleError
from recovery.contract_fields import NoNul, Whole
from recovery.models import State
from recovery.params_schema import params_schema

KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@~-]{0,199}$"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@~ -]{0,199}$"
DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
# Fencing tokens are printable ASCII (token_urlsafe); anything else cannot be one.
TOKEN_PATTERN = r"^[!-~]{1,64}$"
# Lines of a permit's history in one answer, unless asked for fewer; at most so many.
HISTORY_PAGE = 100
HISTORY_PAGE_MAX = 500
# The longest an operation's read may be held for its approval's decision (?wait=).
OPERATION_WAIT_MAX = 25


# Each text field: at most so many characters, without NUL, matching its pattern.
Key = Annotated[str, StringConstraints(max_length=200, pattern=KEY_PATTERN), NoNul]
Name = Annotated[str, StringConstraints(max_length=200, pattern=NAME_PATTERN), NoNul]
Digest = Annotated[str, StringConstraints(max_length=71, pattern=DIGEST_PATTERN), NoNul]
Token = Annotated[str, StringConstraints(max_length=64, pattern=TOKEN_PATTERN), NoNul]
ProviderName = Annotated[str, StringConstraints(max_length=100), NoNul]
Reference = Annotated[str, StringConstraints(max_length=200), NoNul]
Reason = Annotated[str, StringConstraints(max_length=500), NoNul]
OperationState = Annotated[str, Field(json_schema_extra={"enum": list(State.values)})]
Timestamp = Annotated[str, Field(json_schema_extra={"format": "date-time"})]
Outcome = Literal["committed", "failed"]


class Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


# -- requests -------------------------------------------------------------------------


PARTY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@~-]{0,99}$"
PartyId = Annotated[str, StringConstraints(max_length=100, pattern=PARTY_PATTERN), NoNul]


class PartyRequest(Body):
    """The customer the host acts for, by the host's own stable id for them."""

    id: PartyId = Field(description="The host's own stable id for the person (cust_8812).")
    name: Annotated[str, StringConstraints(max_length=200), NoNul] = Field(
        default="", description="What the customer is called, as the host shows it."
    )
    contact: Annotated[str, StringConstraints(max_length=500), NoNul] = Field(
        default="",
        description="An Apprise URL Settle sends the approval link to, of a scheme and "
        "server the operator allows (else contact_not_allowed); leave it out to deliver "
        "the link yourself.",
    )


class OpenApprovalRequest(Body):
    proposer: Annotated[str, StringConstraints(max_length=150), NoNul] = Field(
        default="",
        description="The username of the person the host acts for: they never decide it.",
    )
    party: PartyRequest | None = Field(
        default=None,
        description="The customer the host acts for. Required where the policy asks the "
        "customer to decide (else party_required); Settle keeps one record per (host, id).",
    )


class RegisterRequest(Body):
    key: Key
    action: Name
    provider: ProviderName
    params: Any = Field(json_schema_extra=params_schema())
    approval: OpenApprovalRequest | None = Field(
        default=None,
        description="Also open the operation's approval, as POST /api/v1/operations/{key}/"
        "approvals with this body would, when the operation awaits approval: one request "
        "instead of two. The answer then holds the approval.",
    )
    dispatch: DispatchRequest | None = Field(
        default=None,
        description="Also open the approval (as approval would, {} if not given) and, "
        "when the policy approves the opening by itself, "
        "dispatch, as POST /api/v1/operations/{key}/dispatch with this body would (the "
        "permit consumed and the dispatch created in one transaction). The answer then "
        "holds the dispatch, or why the permit was not consumed. An approval a person "
        "must decide is answered as without it.",
    )

    def opening(self) -> OpenApprovalRequest | None:
        """The approval to open with the registration: ``approval``, or ``{}`` where only
        the dispatch was asked (a dispatch needs its opening)."""
        if self.approval is None and self.dispatch is not None:
            return OpenApprovalRequest()
        return self.approval


class DecisionRequest(Body):
    decision: Literal["approve", "deny"]
    ttl_seconds: Annotated[int, Field(ge=1, le=MAX_TTL_SECONDS), Whole] = 300
    params_digest: Digest = Field(description="The digest of the parameters reviewed.")
    reason: Reason = ""


class RevokeRequest(Body):
    reason: Reason


class DispatchRequest(Body):
    worker: Name
    params_digest: Digest


class HeartbeatRequest(Body):
    fencing_token: Token


class ResultRequest(Body):
    fencing_token: Token
    outcome: Outcome
    provider_reference: Reference = ""
    result: Any = Field(
        default=None,
        json_schema_extra={
            **params_schema(),
            "description": f"What the effect returned, kept with the receipt for a repeat "
            f"of the call: a JSON object of at most {MAX_RESULT_BYTES // 1024} KiB canonical "
            f"(RFC 8785), with the limits of params. Only the first report's is kept.",
        },
    )

    def result_checked(self) -> dict[str, Any] | None:
        """``result``: a JSON object with a canonical form, at most ``MAX_RESULT_BYTES``
        of it (``invalid_field``, reason ``result_too_large``)."""
        if self.result is None:
            return None
        try:
            size = len(canonical_params(self.result).encode("utf-8"))
        except CanonicalError as exc:
            message = exc.message.replace("params", "result")
            raise ApiError(ErrorCode.INVALID_FIELD, f"result: {message}") from None
        if size > MAX_RESULT_BYTES:
            raise ApiError(
                ErrorCode.INVALID_FIELD,
                f"result is {size} bytes canonical; the limit is {MAX_RESULT_BYTES}",
                reason="result_too_large",
            )
        assert isinstance(self.result, dict)
        return self.result


class ResumeRequest(Body):
    worker: Name


class CallbackRequest(Body):
    operation_key: Key
    status: Outcome
    params_digest: Digest
    reference: Reference
    sequence: Annotated[int, Field(ge=0, le=MAX_SAFE_INTEGER), Whole]


# -- responses ------------------------------------------------------------------------


class OperationSummary(Body):
    key: Key
    state: OperationState
    params_digest: Digest
    version: int


class Needs(Body):
    """Which policy rule applied, and what the approval still needs."""

    rule: str = Field(description="The policy rule that applied; empty: none (one person).")
    required: int = Field(description="Distinct people whose approval it needs.")
    approvals: int = Field(description="People who approved it so far.")
    needed: str = Field(description='What it still needs, as people read it: "1 of 2 approvals".')


class PartyRecord(Body):
    id: str
    name: str
    contact: str | SkipJsonSchema[None] = None


LINK_DESCRIPTION = (
    "The customer's approval link, while the approval is pending and addressed to the "
    "customer: deliver it over your own channel. Whoever holds it can decide as the "
    "customer; it expires with the approval (expires_at)."
)
EXPIRES_DESCRIPTION = (
    "When the permit expires, once approved; while pending and addressed to the "
    "customer, when the approval and its link expire."
)


class ApprovalOpened(Needs):
    approval_id: str
    status: str
    permit_id: str | None = Field(description="The permit, when the policy approved it.")
    expires_at: Timestamp | None = Field(description=EXPIRES_DESCRIPTION)
    party: PartyRecord | SkipJsonSchema[None] = Field(
        default=None, description="The customer the approval names, when it names one."
    )
    link: str | SkipJsonSchema[None] = Field(default=None, description=LINK_DESCRIPTION)


class Registered(OperationSummary):
    approval: ApprovalOpened | None = Field(
        default=None,
        description="The approval opened (or the pending one), when the request asked for "
        "it and the operation awaits approval; left out otherwise. state and version are "
        "the operation's as registered: approval.status says whether a policy decided it.",
    )
    dispatch: Dispatched | None = Field(
        default=None,
        description="The dispatch this request created, when it asked for one and the "
        "policy approved the opening; left out otherwise.",
    )
    dispatch_refused: str | None = Field(
        default=None,
        description="Why the permit the policy issued was not consumed (the code POST "
        ".../dispatch would answer, such as action_mismatch); left out otherwise. The "
        "operation is then where that refusal left it: resume says what to do.",
    )


class ApprovalRecord(Needs):
    """Exactly what an approver would approve."""

    approval_id: str
    status: str
    operation_key: Key
    action: str
    provider: str
    host: str
    params: dict[str, Any] | None
    params_digest: Digest
    requested_at: Timestamp
    decided_by: str
    decided_at: Timestamp | None
    permit_id: str | None
    expires_at: Timestamp | None = Field(description=EXPIRES_DESCRIPTION)
    party: PartyRecord | SkipJsonSchema[None] = Field(
        default=None,
        description="The customer the approval names (to the host that opened it and staff).",
    )
    link: str | SkipJsonSchema[None] = Field(
        default=None, description=LINK_DESCRIPTION + " Only to the host that opened it."
    )


class Decided(Needs):
    approval_id: str
    status: str
    permit_id: str | None
    expires_at: Timestamp | None


class Revoked(Body):
    permit_id: str
    status: str
    revoked: bool


class Dispatched(Body):
    fencing_token: str
    permit_id: str
    lease_expires_at: Timestamp


class Heartbeat(Body):
    lease_expires_at: Timestamp


class Reported(Body):
    applied: bool = Field(description="false: a later duplicate, recorded and ignored")
    state: OperationState
    receipt: str


class Resumed(Body):
    decision: Literal[
        "wait", "dispatch", "in_progress", "released", "unknown", "reconcile", "closed"
    ] = Field(description="What the worker should do; see the README's resume table.")
    state: OperationState
    recovered: bool
    # Sent only when set (never null), as are the optional fields below.
    fencing_token: str | SkipJsonSchema[None] = None
    retry_after: Annotated[int, Field(ge=1)] | SkipJsonSchema[None] = Field(
        default=None,
        description="Seconds until asking again is worth it: the dispatch's lease is "
        "still alive, or a lookup of the operation is queued or running (both decision "
        "in_progress), or its next lookup is not due yet.",
    )


class CallbackApplied(Body):
    applied: bool
    state: OperationState
    reason: str | SkipJsonSchema[None] = None


class PermitLine(Body):
    kind: str
    reason: str
    actor: str = Field(description="kind:name of who acted")
    at: Timestamp
    detail: dict[str, Any]


class PermitRecord(Body):
    permit_id: str
    approval_id: str
    status: str
    params_digest: Digest
    issued_at: Timestamp
    expires_at: Timestamp
    consumed_at: Timestamp | None
    revoked_at: Timestamp | None
    history: list[PermitLine] = Field(description="The first page of the history, oldest first")
    history_next: str | None = Field(
        description="The URL of the history's next page (GET .../history?after=...), or "
        "null when this is all of it"
    )


class HistoryPage(Body):
    """One page of the history of an operation's newest permit, oldest first."""

    permit_id: str
    lines: list[PermitLine]
    next: str | None = Field(description="The URL of the next page, or null at the end")


class DispatchRecord(Body):
    worker: str
    permit_id: str
    created_at: Timestamp
    lease_expires_at: Timestamp
    last_heartbeat_at: Timestamp | None


class ReceiptRecord(Body):
    status: str
    provider_reference: str
    recovered: bool
    evidence_id: int | None
    reported_at: Timestamp | None
    result: dict[str, Any] | None = Field(
        default=None, description="What the effect returned, as its first report said."
    )


class EvidenceRecord(Body):
    evidence_id: int
    source: str
    verdict: str
    provider_status: str
    provider_reference: str
    detail: str
    raw: Any
    raw_digest: str
    captured_at: Timestamp


class OperationRecord(Body):
    """The whole record of one operation."""

    key: Key
    action: str
    provider: str
    params: dict[str, Any]
    params_digest: Digest
    state: OperationState
    version: int
    recovered: bool
    created_at: Timestamp
    updated_at: Timestamp
    permit: PermitRecord | None
    dispatch: DispatchRecord | None
    receipt: ReceiptRecord | None
    evidence: list[EvidenceRecord]


# Registering may carry a dispatch's request and answer, defined further down.
RegisterRequest.model_rebuild()
Registered.model_rebuild()

# Every ``error`` code a response can carry: the codes marked for the host API, in order.
ERROR_CODES = [code.value for code in ErrorCode if code.api]


class Error(BaseModel):
    """Every refusal: a stable code and a human message, sometimes with details."""

    model_config = ConfigDict(extra="allow")

    error: str = Field(json_schema_extra={"enum": cast(list[JsonValue], ERROR_CODES)})
    message: str


def dump_json(model: BaseModel) -> bytes:
    """A response body's JSON, written by pydantic's own serializer: unset optional fields
    are left out rather than sent as null."""
    return model.__pydantic_serializer__.to_json(model, exclude_unset=True)


# -- validation errors as the API's codes ---------------------------------------------


class ApiError(SettleError):
    """A refused request that only the HTTP layer raises (parsing, credentials, limits)."""


def refusal(exc: ValidationError) -> ApiError:
    """The one mapping from a validation error to the API's codes.

    Unknown fields first (400 ``unknown_field``, all of them named); then the first
    field in declaration order: absent is 422 ``missing_field``, anything else 422
    ``invalid_field``.
    """
    errors = exc.errors(include_url=False, include_input=False)
    unknown = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
    if unknown:
        return ApiError(
            ErrorCode.UNKNOWN_FIELD, f"unknown field(s): {', '.join(unknown)}", fields=unknown
        )
    first = errors[0]
    name = str(first["loc"][0]) if first["loc"] else ""
    if first["type"] == "missing":
        return ApiError(ErrorCode.MISSING_FIELD, f"{name} is required", field=name)
    return ApiError(ErrorCode.INVALID_FIELD, f"{name}: {first['msg'].lower()}", field=name)


M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], body: dict[str, Any]) -> M:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise refusal(exc) from None
