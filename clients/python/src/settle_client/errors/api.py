"""The server's answers as typed exceptions, and ``SettleError``, the root of them all.

``ApiError`` and its subclasses: one class per stable error code (``ERRORS_BY_CODE``),
grouped by what a caller can do about them; ``api_error`` picks the class for an answer.
"""

from __future__ import annotations

from typing import Any


class SettleError(Exception):
    """Anything the client raises; ``code`` is stable."""

    code = "settle_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class ApiError(SettleError):
    """Settle refused the request: ``status`` is the HTTP status, ``code`` its error code."""

    def __init__(self, message: str, *, status: int = 0, code: str = "", **details: Any) -> None:
        super().__init__(message, **details)
        self.status = status
        if code:
            self.code = code


class InvalidRequest(ApiError):
    """The request itself is wrong; sending it again changes nothing."""


class AuthError(ApiError):
    """The credential is missing, unknown, revoked or not allowed to do this."""


class NotFoundError(ApiError):
    """What was named does not exist, or not for this caller."""


class ConflictError(ApiError):
    """The request meets the operation in a state where it cannot apply."""


class PermitRefused(ConflictError):
    """Dispatch refused: the permit was not consumed (and the refusal is recorded)."""


class FencingError(ConflictError):
    """The fencing token no longer holds the dispatch (heartbeat or report)."""


class ServerError(ApiError):
    """Settle failed to answer; nothing was changed."""


class MalformedJson(InvalidRequest):
    """Not JSON."""

    code = "malformed_json"


class DuplicateKey(InvalidRequest):
    """A key twice."""

    code = "duplicate_key"


class NonFiniteNumber(InvalidRequest):
    """NaN/Inf."""

    code = "non_finite_number"


class TooDeep(InvalidRequest):
    """Nested too deep."""

    code = "too_deep"


class InvalidBody(InvalidRequest):
    """Not a JSON object."""

    code = "invalid_body"


class UnknownField(InvalidRequest):
    """An unknown field."""

    code = "unknown_field"


class MissingField(InvalidRequest):
    """A field is missing."""

    code = "missing_field"


class InvalidField(InvalidRequest):
    """A field is invalid."""

    code = "invalid_field"


class InvalidParams(InvalidRequest):
    """Params refused."""

    code = "invalid_params"


class ParamsTooLarge(InvalidRequest):
    """Over 64 KiB."""

    code = "params_too_large"


class BodyTooLarge(InvalidRequest):
    """Body too large."""

    code = "body_too_large"


class UnsupportedMediaType(InvalidRequest):
    """Not JSON."""

    code = "unsupported_media_type"


class InvalidTtl(InvalidRequest):
    """A ttl out of range."""

    code = "invalid_ttl"


class MethodNotAllowed(InvalidRequest):
    """Bad verb."""

    code = "method_not_allowed"


class Unauthorized(AuthError):
    """No valid bearer token."""

    code = "unauthorized"


class Forbidden(AuthError):
    """This credential may not do this."""

    code = "forbidden"


class CsrfFailed(AuthError):
    """A session without CSRF."""

    code = "csrf_failed"


class BadSignature(AuthError):
    """A wrong callback signature."""

    code = "bad_signature"


class UnknownOperation(NotFoundError):
    """No such key."""

    code = "unknown_operation"


class UnknownProvider(NotFoundError):
    """No provider."""

    code = "unknown_provider"


class UnknownApproval(NotFoundError):
    """No approval."""

    code = "unknown_approval"


class UnknownPermit(NotFoundError):
    """No such permit."""

    code = "unknown_permit"


class UnknownParty(NotFoundError):
    """No such customer (party) of this host."""

    code = "unknown_party"


class UnknownPasskey(NotFoundError):
    """No such passkey of this party."""

    code = "unknown_passkey"


class NotFound(NotFoundError):
    """No such path."""

    code = "not_found"


class KeyConflict(ConflictError):
    """The key names a different action."""

    code = "key_conflict"


class InvalidState(ConflictError):
    """Not in that state."""

    code = "invalid_state"


class StaleState(ConflictError):
    """The operation moved on."""

    code = "stale_state"


class AlreadyDecided(ConflictError):
    """Decided before."""

    code = "already_decided"


class DigestMismatch(ConflictError):
    """Not the digest under review."""

    code = "digest_mismatch"


class AlreadyVoted(ConflictError):
    """This person decided this approval already: each counts once."""

    code = "already_voted"


class DecisionTooLate(ConflictError):
    """The approval's time ran out before this decision: it decides nothing, and the
    approval and its operation are closed as expired (``ApprovalExpired`` is what
    ``run()`` raises for such an operation)."""

    code = "approval_expired"


class ProposerExcluded(AuthError):
    """The person the host acts for may not decide its approval."""

    code = "proposer_excluded"


class NotInGroup(AuthError):
    """The approval needs a person from the groups its policy rule names."""

    code = "not_in_group"


class PasskeyRequired(AuthError):
    """The decision must be signed with the person's passkey (in the console)."""

    code = "passkey_required"


class PartyRequired(InvalidRequest):
    """The policy asks the customer to decide: open the approval naming the ``party``."""

    code = "party_required"


class CustomerRequired(AuthError):
    """The approval awaits the customer's own decision: staff cannot stand in for it."""

    code = "customer_required"


class ContactNotAllowed(InvalidRequest):
    """The party's contact is not a scheme and server Settle's operator allows."""

    code = "contact_not_allowed"


class NotAuthorized(PermitRefused):
    """No permit."""

    code = "not_authorized"


class ActionMismatch(PermitRefused):
    """Not the approved action."""

    code = "action_mismatch"


class PermitExpired(PermitRefused):
    """The permit expired."""

    code = "expired"


class PermitRevoked(PermitRefused):
    """The permit was revoked."""

    code = "revoked"


class AlreadyConsumed(PermitRefused):
    """Dispatched before (execution_state)."""

    code = "already_consumed"


class StaleFencingToken(FencingError):
    """Not the dispatch's token."""

    code = "stale_fencing_token"


class LeaseLost(FencingError):
    """The lease lapsed."""

    code = "lease_lost"


class DatabaseUnavailable(ServerError):
    """Retry later."""

    code = "database_unavailable"


class RateLimited(ApiError):
    """This credential is past its rate; nothing was done. ``retry_after``: seconds."""

    code = "rate_limited"


class InvalidCursor(InvalidRequest):
    """A history page's ``after`` that is not the cursor of a next link."""

    code = "invalid_cursor"


class InvalidPageSize(InvalidRequest):
    """A history page's ``limit`` outside 1 to 500."""

    code = "invalid_page_size"


class InvalidWait(InvalidRequest):
    """A read's ``wait`` that is not whole seconds from 1 to 25."""

    code = "invalid_wait"


class InternalError(ServerError):
    """A server bug."""

    code = "internal_error"


# Every error code of the API (its OpenAPI document's Error.error enum) and its class.
ERRORS_BY_CODE: dict[str, type[ApiError]] = {
    cls.code: cls
    for cls in (
        MalformedJson,
        DuplicateKey,
        NonFiniteNumber,
        TooDeep,
        InvalidBody,
        UnknownField,
        MissingField,
        InvalidField,
        InvalidParams,
        ParamsTooLarge,
        BodyTooLarge,
        UnsupportedMediaType,
        InvalidTtl,
        MethodNotAllowed,
        Unauthorized,
        Forbidden,
        CsrfFailed,
        BadSignature,
        UnknownOperation,
        UnknownProvider,
        UnknownApproval,
        UnknownPermit,
        UnknownParty,
        UnknownPasskey,
        NotFound,
        KeyConflict,
        InvalidState,
        StaleState,
        AlreadyDecided,
        DigestMismatch,
        AlreadyVoted,
        DecisionTooLate,
        ProposerExcluded,
        NotInGroup,
        PasskeyRequired,
        PartyRequired,
        CustomerRequired,
        ContactNotAllowed,
        NotAuthorized,
        ActionMismatch,
        PermitExpired,
        PermitRevoked,
        AlreadyConsumed,
        StaleFencingToken,
        LeaseLost,
        DatabaseUnavailable,
        InternalError,
        RateLimited,
        InvalidCursor,
        InvalidPageSize,
        InvalidWait,
    )
}
_BY_STATUS: dict[int, type[ApiError]] = {
    400: InvalidRequest,
    401: AuthError,
    403: AuthError,
    404: NotFoundError,
    409: ConflictError,
    413: InvalidRequest,
    415: InvalidRequest,
    422: InvalidRequest,
    429: RateLimited,
}


def api_error(status: int, body: dict[str, Any]) -> ApiError:
    """The exception for an error answer; a code this client does not know keeps its group."""
    code = str(body.get("error", ""))
    message = str(body.get("message", "")) or f"HTTP {status}"
    details = {name: value for name, value in body.items() if name not in ("error", "message")}
    cls = (
        ERRORS_BY_CODE.get(code)
        or _BY_STATUS.get(status)
        or (ServerError if status >= 500 else ApiError)
    )
    # The answer's own ``status`` and ``code`` are attributes; a detail of either name (a
    # permit's "status") stays in ``details`` only, instead of clashing with them.
    error = cls(
        message,
        status=status,
        code=code,
        **{name: value for name, value in details.items() if name not in ("status", "code")},
    )
    error.details = details
    return error
