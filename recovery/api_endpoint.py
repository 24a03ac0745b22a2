"""What one endpoint of the host API declares, and which error codes it can answer with.

``recovery.openapi`` lists the endpoints and makes the document from them. The codes are
grouped by the layer that answers them (around every view, a bearer token's checks, a
JSON body, pages and lookups, the services behind a write), so an endpoint names only its
own, and a refusal added to the enum later is declared wherever its layer is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel

from common.errors import ErrorCode

# An OpenAPI link: the target's operationId, its parameters and its request body's fields,
# each a runtime expression on the answer (or the request) it follows.
Link = tuple[str, dict[str, str], dict[str, str] | None]


@dataclass(frozen=True)
class Endpoint:
    path: str
    method: str
    operation_id: str
    summary: str
    request: type[BaseModel] | None
    # status → (description, body model; None: the Error schema)
    responses: dict[int, tuple[str, type[BaseModel] | None]]
    parameters: tuple[str, ...] = ()
    query: tuple[str, ...] = ()
    signed: bool = False  # authenticated by the provider's signature, not a bearer token
    # The codes this endpoint's own view and services answer with, beyond the shared ones.
    codes: tuple[ErrorCode, ...] = ()
    # Per status, what the codes mean here (else the status's general description).
    errors: dict[int, str] = field(default_factory=dict)
    # Per success status, the links that follow it, by name.
    links: dict[int, dict[str, Link]] = field(default_factory=dict)

    @property
    def body(self) -> bool:
        return self.request is not None

    @property
    def writes(self) -> bool:
        """A bearer-authenticated POST: it calls a service that may refuse."""
        return self.method == "post" and not self.signed


# What the layers around every view answer with (recovery.api.api_view): the method, an
# unexpected error, the database.
AROUND = (ErrorCode.METHOD_NOT_ALLOWED, ErrorCode.INTERNAL_ERROR, ErrorCode.DATABASE_UNAVAILABLE)
# A bearer token's checks (api._authenticate, api._rate_limit); a console session must
# bring its CSRF token, and a held one its passkey.
BEARER = (
    ErrorCode.UNAUTHORIZED,
    ErrorCode.FORBIDDEN,
    ErrorCode.CSRF_FAILED,
    ErrorCode.PASSKEY_REQUIRED,
    ErrorCode.RATE_LIMITED,
)
# A JSON body's parsing and its fields (api._json_body, contract.refusal).
BODY = (
    ErrorCode.UNSUPPORTED_MEDIA_TYPE,
    ErrorCode.BODY_TOO_LARGE,
    ErrorCode.MALFORMED_JSON,
    ErrorCode.DUPLICATE_KEY,
    ErrorCode.NON_FINITE_NUMBER,
    ErrorCode.TOO_DEEP,
    ErrorCode.INVALID_BODY,
    ErrorCode.UNKNOWN_FIELD,
    ErrorCode.MISSING_FIELD,
    ErrorCode.INVALID_FIELD,
)
# Answered only where a view reads a query or names something by its path.
PAGES = (ErrorCode.INVALID_CURSOR, ErrorCode.INVALID_PAGE_SIZE)
LOOKUPS = (
    ErrorCode.NOT_FOUND,
    ErrorCode.UNKNOWN_OPERATION,
    ErrorCode.UNKNOWN_PROVIDER,
    ErrorCode.UNKNOWN_APPROVAL,
    ErrorCode.UNKNOWN_PERMIT,
    ErrorCode.BAD_SIGNATURE,
)
# The refusals of the services behind the host API (approvals, permits, dispatch): a write
# may meet any of them, and one added to the enum (marked ``api``) is declared with them.
SERVICE = tuple(
    code
    for code in ErrorCode
    if code.api and code not in (*AROUND, *BEARER, *BODY, *PAGES, *LOOKUPS)
)

# What each status means when an endpoint says nothing of its own.
STATUS_DESCRIPTIONS = {
    400: "Malformed body, duplicate keys, non-finite numbers or unknown fields",
    401: "Missing, unknown or disabled bearer token",
    403: "This kind of credential may not do this, a console session without CSRF, or "
    "a session held until its passkey is used",
    404: "No such thing, or not for this caller",
    405: "Method not allowed (see the Allow header)",
    409: "Refused: the state of the operation, approval or permit does not allow it",
    413: "The body is too large",
    415: "The body is not application/json",
    422: "A missing field, or a field of the wrong type or format",
    429: "rate_limited: this credential is past its rate; retry after Retry-After seconds",
    500: "internal_error: unexpected (logged with the request id)",
    503: "The database refused the change; retry",
}


def endpoint_codes(endpoint: Endpoint) -> list[ErrorCode]:
    """Every code ``endpoint`` may answer with, in the enum's order."""
    codes = {*AROUND, *endpoint.codes}
    if not endpoint.signed:
        codes.update(BEARER)
    if endpoint.body:
        codes.update(BODY)
    if endpoint.writes:
        codes.update(SERVICE)
    return [code for code in ErrorCode if code in codes]


def endpoint_statuses(endpoint: Endpoint) -> dict[int, str]:
    """status → description, for every status of ``endpoint_codes``."""
    statuses: dict[int, str] = {}
    for code in endpoint_codes(endpoint):
        statuses[code.status] = endpoint.errors.get(code.status) or STATUS_DESCRIPTIONS.get(
            code.status, code.message
        )
    return statuses
