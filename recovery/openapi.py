"""The OpenAPI 3.1 document of the host API, generated from ``recovery.contract``.

Served at /api/openapi.json. Each endpoint names its request model and, per status, its
response model; errors all share the ``Error`` schema. Nothing here restates a field.
The statuses an endpoint declares are those of the ``ErrorCode`` members it can answer
with, read from the enum, and its links say which answer's values the next call takes
(what a fuzzer's stateful phase follows).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, models_json_schema

from common.errors import ErrorCode
from recovery import contract

REF = contract.REF


class _Schema(GenerateJsonSchema):
    """Pydantic's JSON Schema, without a title on every property and without the
    ``default: null`` of fields that are left out when unset (they are never null)."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def default_schema(self, schema: Any) -> Any:
        generated = super().default_schema(schema)
        if generated.get("default", ...) is None and "anyOf" not in generated:
            del generated["default"]
        return generated


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


# Links: the key of an operation, from its registration to what a host does with it next.
_KEY = {"key": "$response.body#/key"}
_APPROVAL = {"approval_id": "$response.body#/approval_id"}


def _operation_links() -> dict[str, Link]:
    return {
        "record": ("getOperation", _KEY, None),
        "history": ("getOperationHistory", _KEY, None),
        "approvals": ("openApproval", _KEY, None),
        "dispatch": ("dispatchOperation", _KEY, {"params_digest": "$response.body#/params_digest"}),
        "resume": ("resumeOperation", _KEY, None),
        "result": ("reportResult", _KEY, None),
    }


E = ErrorCode

ENDPOINTS = [
    Endpoint(
        "/api/v1/operations",
        "post",
        "registerOperation",
        "Register an operation (idempotent per key), and open its approval if asked",
        contract.RegisterRequest,
        {
            201: ("Registered", contract.Registered),
            200: ("The same registration again", contract.Registered),
        },
        codes=(E.UNKNOWN_PROVIDER, E.KEY_CONFLICT, E.INVALID_PARAMS, E.PARAMS_TOO_LARGE),
        errors={
            404: "unknown_provider: no such provider",
            409: "key_conflict: the key exists with a different action, provider or params",
            413: "body_too_large, or params_too_large (over 64 KiB canonical)",
            422: "missing_field, invalid_field, or invalid_params (with a reason: "
            "integer_out_of_range, too_deep, …)",
        },
        links={201: _operation_links(), 200: _operation_links()},
    ),
    Endpoint(
        "/api/v1/operations/{key}",
        "get",
        "getOperation",
        "The whole record: state, permit and its history, dispatch, receipt, evidence",
        None,
        {200: ("The record", contract.OperationRecord)},
        parameters=("key",),
        codes=(E.UNKNOWN_OPERATION,),
    ),
    Endpoint(
        "/api/v1/operations/{key}/history",
        "get",
        "getOperationHistory",
        "A page of the newest permit's history, oldest first (follow next)",
        None,
        {200: ("The page", contract.HistoryPage)},
        parameters=("key",),
        query=("after", "limit"),
        codes=(E.UNKNOWN_OPERATION, *PAGES),
        errors={400: "invalid_cursor, or invalid_page_size"},
    ),
    Endpoint(
        "/api/v1/operations/{key}/approvals",
        "post",
        "openApproval",
        "Ask for approval of the exact action (the body may be empty)",
        contract.OpenApprovalRequest,
        {
            201: ("Approval opened", contract.ApprovalOpened),
            200: ("The pending approval already open", contract.ApprovalOpened),
        },
        parameters=("key",),
        codes=(E.UNKNOWN_OPERATION, E.INVALID_STATE),
        errors={409: "invalid_state: the operation is not awaiting approval"},
        links={
            status: {
                "detail": ("getApproval", _APPROVAL, None),
                "decision": ("decideApproval", _APPROVAL, None),
            }
            for status in (201, 200)
        },
    ),
    Endpoint(
        "/api/v1/approvals/{approval_id}",
        "get",
        "getApproval",
        "Exactly what would be approved (an approver within its scope, or a console user "
        "who may view the provider's operations)",
        None,
        {200: ("The approval and the exact action", contract.ApprovalRecord)},
        parameters=("approval_id",),
        codes=(E.UNKNOWN_APPROVAL,),
        links={
            200: {
                # What was reviewed is what is decided: the digest comes with the id.
                "decision": (
                    "decideApproval",
                    _APPROVAL,
                    {"params_digest": "$response.body#/params_digest"},
                ),
                # Once approved, the host dispatches it (with its own token).
                "dispatch": (
                    "dispatchOperation",
                    {"key": "$response.body#/operation_key"},
                    {"params_digest": "$response.body#/params_digest"},
                ),
            }
        },
    ),
    Endpoint(
        "/api/v1/approvals/{approval_id}/decision",
        "post",
        "decideApproval",
        "Approve or deny exactly what was reviewed (an approver within its scope, or a "
        "console user with the decide permission on the provider)",
        contract.DecisionRequest,
        {200: ("Decided", contract.Decided)},
        parameters=("approval_id",),
        codes=(E.UNKNOWN_APPROVAL, E.ALREADY_DECIDED, E.STALE_STATE, E.DIGEST_MISMATCH),
        errors={
            403: "A host token, a console user who may view but not decide, no CSRF, "
            "proposer_excluded, not_in_group, or passkey_required",
            409: "already_decided, already_voted, stale_state, or digest_mismatch (recorded)",
            422: "missing_field, invalid_field, or invalid_ttl",
        },
        links={200: {"revoke": ("revokePermit", {"permit_id": "$response.body#/permit_id"}, None)}},
    ),
    Endpoint(
        "/api/v1/permits/{permit_id}/revoke",
        "post",
        "revokePermit",
        "Revoke a permit (guards the future: a consumed permit stays consumed)",
        contract.RevokeRequest,
        {200: ("Revoked, or recorded as ignored", contract.Revoked)},
        parameters=("permit_id",),
        codes=(E.UNKNOWN_PERMIT, E.STALE_STATE),
        errors={409: "stale_state: the operation moved on"},
    ),
    Endpoint(
        "/api/v1/operations/{key}/dispatch",
        "post",
        "dispatchOperation",
        "Consume the permit and create the one dispatch",
        contract.DispatchRequest,
        {200: ("This caller holds the dispatch", contract.Dispatched)},
        parameters=("key",),
        codes=(
            E.UNKNOWN_OPERATION,
            E.NOT_AUTHORIZED,
            E.ACTION_MISMATCH,
            E.EXPIRED,
            E.REVOKED,
            E.ALREADY_CONSUMED,
        ),
        errors={
            409: "Refused and recorded: not_authorized, action_mismatch, expired, revoked, "
            "or already_consumed (with execution_state)",
        },
        links={
            200: {
                name: (
                    target,
                    {"key": "$request.path.key"},
                    {"fencing_token": "$response.body#/fencing_token"},
                )
                for name, target in (("heartbeat", "heartbeatDispatch"), ("result", "reportResult"))
            }
        },
    ),
    Endpoint(
        "/api/v1/operations/{key}/heartbeat",
        "post",
        "heartbeatDispatch",
        "Extend the dispatch lease",
        contract.HeartbeatRequest,
        {200: ("Lease extended", contract.Heartbeat)},
        parameters=("key",),
        codes=(E.UNKNOWN_OPERATION, E.STALE_FENCING_TOKEN, E.LEASE_LOST),
        errors={409: "stale_fencing_token or lease_lost"},
    ),
    Endpoint(
        "/api/v1/operations/{key}/result",
        "post",
        "reportResult",
        "Report the outcome (the first report wins)",
        contract.ResultRequest,
        {200: ("Recorded (applied false: a later duplicate)", contract.Reported)},
        parameters=("key",),
        codes=(E.UNKNOWN_OPERATION, E.STALE_FENCING_TOKEN, E.STALE_STATE),
        errors={409: "stale_fencing_token, or stale_state: the operation moved on"},
    ),
    Endpoint(
        "/api/v1/operations/{key}/resume",
        "post",
        "resumeOperation",
        "What a fresh worker should do; never a second dispatch",
        contract.ResumeRequest,
        {200: ("Decision", contract.Resumed)},
        parameters=("key",),
        codes=(E.UNKNOWN_OPERATION, E.STALE_STATE),
        errors={409: "stale_state: the operation moved on"},
    ),
    Endpoint(
        "/api/v1/providers/{name}/callbacks",
        "post",
        "providerCallback",
        "Signed asynchronous provider notification (X-Provider-Signature: hex HMAC-SHA256 "
        "of the raw body)",
        contract.CallbackRequest,
        {
            200: (
                "Applied, or recorded as stale (applied false, with reason)",
                contract.CallbackApplied,
            )
        },
        parameters=("name",),
        signed=True,
        codes=(E.BAD_SIGNATURE, E.UNKNOWN_PROVIDER, E.UNKNOWN_OPERATION, E.STALE_STATE),
        errors={
            401: "bad_signature",
            404: "unknown_provider, or unknown_operation at this provider",
            409: "stale_state: the operation moved on",
        },
    ),
]

QUERY_PARAMETERS = {
    "after": (
        "The cursor from a next link: lines after it",
        {"type": "string", "pattern": r"^[0-9]{1,18}$"},
    ),
    "limit": (
        "Lines per page",
        {
            "type": "integer",
            "minimum": 1,
            "maximum": contract.HISTORY_PAGE_MAX,
            "default": contract.HISTORY_PAGE,
        },
    ),
}

PATH_PARAMETERS = {
    "key": contract.KEY_PATTERN,
    "approval_id": None,
    "permit_id": None,
    "name": None,
}


def _models() -> list[tuple[type[BaseModel], JsonSchemaMode]]:
    models: list[tuple[type[BaseModel], JsonSchemaMode]] = [(contract.Error, "serialization")]
    for endpoint in ENDPOINTS:
        if endpoint.request is not None:
            models.append((endpoint.request, "validation"))
        for _, model in endpoint.responses.values():
            if model is not None:
                models.append((model, "serialization"))
    return list(dict.fromkeys(models))


def _content(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _link(target: str, parameters: dict[str, str], body: dict[str, str] | None) -> dict[str, Any]:
    link: dict[str, Any] = {"operationId": target, "parameters": parameters}
    if body is not None:
        link["requestBody"] = body
    return link


def _operation(endpoint: Endpoint, refs: dict[Any, Any]) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "operationId": endpoint.operation_id,
        "summary": endpoint.summary,
        "responses": {},
    }
    if endpoint.request is not None:
        operation["requestBody"] = {
            "required": endpoint.request is not contract.OpenApprovalRequest,
            "content": _content(refs[(endpoint.request, "validation")]),
        }
    for status, (description, model) in endpoint.responses.items():
        operation["responses"][str(status)] = {
            "description": description,
            "content": _content(refs[(model, "serialization")]),
        }
        if status in endpoint.links:
            operation["responses"][str(status)]["links"] = {
                name: _link(*link) for name, link in endpoint.links[status].items()
            }
    if endpoint.signed:
        operation["security"] = []
    error = {"$ref": REF.format(model="Error")}
    for status, description in sorted(endpoint_statuses(endpoint).items()):
        operation["responses"][str(status)] = {
            "description": description,
            "content": _content(error),
        }
    return operation


def openapi_document() -> dict[str, Any]:
    return copy.deepcopy(_document())


@cache
def _document() -> dict[str, Any]:
    refs, definitions = models_json_schema(_models(), ref_template=REF, schema_generator=_Schema)
    paths: dict[str, Any] = {}
    for endpoint in ENDPOINTS:
        item = paths.setdefault(endpoint.path, {})
        if endpoint.parameters:
            item["parameters"] = [
                {
                    "name": name,
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string"}
                    | ({"pattern": PATH_PARAMETERS[name]} if PATH_PARAMETERS[name] else {}),
                }
                for name in endpoint.parameters
            ]
        item[endpoint.method] = _operation(endpoint, refs)
        if endpoint.query:
            item[endpoint.method]["parameters"] = [
                {
                    "name": name,
                    "in": "query",
                    "required": False,
                    "description": QUERY_PARAMETERS[name][0],
                    "schema": QUERY_PARAMETERS[name][1],
                }
                for name in endpoint.query
            ]
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Settle host API",
            "version": "1",
            "description": "Register, approve, dispatch exactly once, report and resume.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": definitions["$defs"] | contract.params_value_schemas(),
        },
    }
