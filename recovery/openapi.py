"""The OpenAPI 3.1 document of the host API, generated from ``recovery.contract``.

Served at /api/openapi.json. Each endpoint names its request model and, per status, its
response model; errors all share the ``Error`` schema. Nothing here restates a field.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, models_json_schema

from recovery import contract

REF = "#/components/schemas/{model}"


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


@dataclass(frozen=True)
class Endpoint:
    path: str
    method: str
    summary: str
    request: type[BaseModel] | None
    # status → (description, body model; None: the Error schema)
    responses: dict[int, tuple[str, type[BaseModel] | None]]
    parameters: tuple[str, ...] = ()
    query: tuple[str, ...] = ()
    signed: bool = False  # authenticated by the provider's signature, not a bearer token
    errors: dict[int, str] = field(default_factory=dict)


# Every authenticated endpoint may answer these, with the Error schema.
COMMON_ERRORS = {
    400: "Malformed body, duplicate keys, non-finite numbers or unknown fields",
    401: "Missing, unknown or disabled bearer token",
    403: "This kind of credential may not do this, or a console session without CSRF",
    404: "No such thing, or not for this caller",
    405: "Method not allowed (see the Allow header)",
    413: "The body is too large",
    415: "The body is not application/json",
    422: "A missing field, or a field of the wrong type or format",
    429: "rate_limited: this credential is past its rate; retry after Retry-After seconds",
    500: "internal_error: unexpected (logged with the request id)",
    503: "The database refused the change; retry",
}

ENDPOINTS = [
    Endpoint(
        "/api/v1/operations",
        "post",
        "Register an operation (idempotent per key)",
        contract.RegisterRequest,
        {
            201: ("Registered", contract.OperationSummary),
            200: ("The same registration again", contract.OperationSummary),
        },
        errors={
            409: "key_conflict: the key exists with a different action, provider or params",
            413: "body_too_large, or params_too_large (over 64 KiB canonical)",
            422: "missing_field, invalid_field, or invalid_params (with a reason)",
        },
    ),
    Endpoint(
        "/api/v1/operations/{key}",
        "get",
        "The whole record: state, permit and its history, dispatch, receipt, evidence",
        None,
        {200: ("The record", contract.OperationRecord)},
        parameters=("key",),
    ),
    Endpoint(
        "/api/v1/operations/{key}/history",
        "get",
        "A page of the newest permit's history, oldest first (follow next)",
        None,
        {200: ("The page", contract.HistoryPage)},
        parameters=("key",),
        query=("after", "limit"),
        errors={400: "invalid_cursor, or invalid_page_size"},
    ),
    Endpoint(
        "/api/v1/operations/{key}/approvals",
        "post",
        "Ask for approval of the exact action (the body may be empty)",
        contract.EmptyRequest,
        {
            201: ("Approval opened", contract.ApprovalOpened),
            200: ("The pending approval already open", contract.ApprovalOpened),
        },
        parameters=("key",),
        errors={409: "invalid_state: the operation is not awaiting approval"},
    ),
    Endpoint(
        "/api/v1/approvals/{approval_id}",
        "get",
        "Exactly what would be approved (an approver within its scope, or a console user "
        "who may view the provider's operations)",
        None,
        {200: ("The approval and the exact action", contract.ApprovalRecord)},
        parameters=("approval_id",),
    ),
    Endpoint(
        "/api/v1/approvals/{approval_id}/decision",
        "post",
        "Approve or deny exactly what was reviewed (an approver within its scope, or a "
        "console user with the decide permission on the provider)",
        contract.DecisionRequest,
        {200: ("Decided", contract.Decided)},
        parameters=("approval_id",),
        errors={
            403: "A host token, a console user who may view but not decide, or no CSRF",
            409: "already_decided, stale_state, or digest_mismatch (recorded)",
            422: "missing_field, invalid_field, or invalid_ttl",
        },
    ),
    Endpoint(
        "/api/v1/permits/{permit_id}/revoke",
        "post",
        "Revoke a permit (guards the future: a consumed permit stays consumed)",
        contract.RevokeRequest,
        {200: ("Revoked, or recorded as ignored", contract.Revoked)},
        parameters=("permit_id",),
        errors={409: "stale_state: the operation moved on"},
    ),
    Endpoint(
        "/api/v1/operations/{key}/dispatch",
        "post",
        "Consume the permit and create the one dispatch",
        contract.DispatchRequest,
        {200: ("This caller holds the dispatch", contract.Dispatched)},
        parameters=("key",),
        errors={
            409: "Refused and recorded: not_authorized, action_mismatch, expired, revoked, "
            "or already_consumed (with execution_state)",
        },
    ),
    Endpoint(
        "/api/v1/operations/{key}/heartbeat",
        "post",
        "Extend the dispatch lease",
        contract.HeartbeatRequest,
        {200: ("Lease extended", contract.Heartbeat)},
        parameters=("key",),
        errors={409: "stale_fencing_token or lease_lost"},
    ),
    Endpoint(
        "/api/v1/operations/{key}/result",
        "post",
        "Report the outcome (the first report wins)",
        contract.ResultRequest,
        {200: ("Recorded (applied false: a later duplicate)", contract.Reported)},
        parameters=("key",),
        errors={409: "stale_fencing_token, or stale_state: the operation moved on"},
    ),
    Endpoint(
        "/api/v1/operations/{key}/resume",
        "post",
        "What a fresh worker should do; never a second dispatch",
        contract.ResumeRequest,
        {200: ("Decision", contract.Resumed)},
        parameters=("key",),
        errors={409: "stale_state: the operation moved on"},
    ),
    Endpoint(
        "/api/v1/providers/{name}/callbacks",
        "post",
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


def _operation(endpoint: Endpoint, refs: dict[Any, Any]) -> dict[str, Any]:
    operation: dict[str, Any] = {"summary": endpoint.summary, "responses": {}}
    if endpoint.request is not None:
        operation["requestBody"] = {
            "required": endpoint.request is not contract.EmptyRequest,
            "content": _content(refs[(endpoint.request, "validation")]),
        }
    for status, (description, model) in endpoint.responses.items():
        operation["responses"][str(status)] = {
            "description": description,
            "content": _content(refs[(model, "serialization")]),
        }
    errors = dict(COMMON_ERRORS)
    if endpoint.signed:
        operation["security"] = []
        del errors[403]
    errors.update(endpoint.errors)
    error = {"$ref": REF.format(model="Error")}
    for status, description in sorted(errors.items()):
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
            "schemas": definitions["$defs"],
        },
    }
