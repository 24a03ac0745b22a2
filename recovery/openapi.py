"""The OpenAPI 3.1 document of the host API, served at /api/openapi.json."""

from __future__ import annotations

from typing import Any

ERROR_CODES = [
    "malformed_json",
    "duplicate_key",
    "non_finite_number",
    "too_deep",
    "invalid_body",
    "unknown_field",
    "missing_field",
    "invalid_field",
    "invalid_params",
    "params_too_large",
    "body_too_large",
    "unsupported_media_type",
    "unauthorized",
    "forbidden",
    "csrf_failed",
    "bad_signature",
    "unknown_operation",
    "unknown_provider",
    "unknown_approval",
    "unknown_permit",
    "key_conflict",
    "invalid_state",
    "stale_state",
    "already_decided",
    "digest_mismatch",
    "invalid_ttl",
    "not_authorized",
    "action_mismatch",
    "expired",
    "revoked",
    "already_consumed",
    "stale_fencing_token",
    "lease_lost",
    "method_not_allowed",
    "not_found",
    "database_unavailable",
    "internal_error",
]


def _obj(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


STR: dict[str, Any] = {"type": "string"}
DIGEST: dict[str, Any] = {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"}
KEY: dict[str, Any] = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:@~-]{0,199}$"}
NAME: dict[str, Any] = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:@~ -]{0,199}$"}


def _op(
    summary: str,
    request: dict[str, Any] | None,
    responses: dict[str, tuple[str, dict[str, Any] | None]],
    *,
    security: bool = True,
) -> dict[str, Any]:
    operation: dict[str, Any] = {"summary": summary, "responses": {}}
    if request is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": request}},
        }
    for code, (description, schema) in responses.items():
        content_schema = schema or {"$ref": "#/components/schemas/Error"}
        operation["responses"][code] = {
            "description": description,
            "content": {"application/json": {"schema": content_schema}},
        }
    if not security:
        operation["security"] = []
    return operation


ERRORS = {
    "400": ("Malformed body, duplicate keys or unknown fields", None),
    "401": ("Missing or unknown bearer token", None),
    "404": ("Unknown operation (for this host)", None),
    "422": ("Missing field or wrong type", None),
}

SUMMARY = _obj(
    {"key": KEY, "state": STR, "params_digest": DIGEST, "version": {"type": "integer"}},
    ["key", "state", "params_digest", "version"],
)


def openapi_document() -> dict[str, Any]:
    key_param = [{"name": "key", "in": "path", "required": True, "schema": KEY}]
    paths: dict[str, Any] = {
        "/api/v1/operations": {
            "post": _op(
                "Register an operation (idempotent per key)",
                _obj(
                    {
                        "key": KEY,
                        "action": NAME,
                        "provider": STR,
                        "params": {
                            "type": "object",
                            "description": "At most 64 KiB canonical (RFC 8785), depth ≤ 10, "
                            "finite numbers, integers within ±(2^53-1).",
                        },
                    },
                    ["key", "action", "provider", "params"],
                ),
                {
                    "201": ("Registered", SUMMARY),
                    "200": ("The same registration again", SUMMARY),
                    "409": ("key_conflict: the key exists with a different action", None),
                    "413": ("params_too_large", None),
                    **ERRORS,
                },
            )
        },
        "/api/v1/operations/{key}": {
            "parameters": key_param,
            "get": _op(
                "The whole record: state, permit and history, dispatch, receipt, evidence",
                None,
                {"200": ("The record", {"type": "object"}), **ERRORS},
            ),
        },
        "/api/v1/operations/{key}/approvals": {
            "parameters": key_param,
            "post": _op(
                "Ask for approval of the exact action",
                None,
                {
                    "201": (
                        "Approval opened",
                        _obj({"approval_id": STR, "status": STR}, ["approval_id", "status"]),
                    ),
                    "200": ("The pending approval already open", None),
                    "409": ("invalid_state", None),
                    **ERRORS,
                },
            ),
        },
        "/api/v1/approvals/{approval_id}": {
            "parameters": [{"name": "approval_id", "in": "path", "required": True, "schema": STR}],
            "get": _op(
                "Exactly what would be approved (an approver in whose scope it is, or a "
                "console user with decide permission)",
                None,
                {
                    "200": (
                        "The approval and the exact action",
                        _obj(
                            {
                                "approval_id": STR,
                                "status": STR,
                                "operation_key": KEY,
                                "action": STR,
                                "provider": STR,
                                "host": STR,
                                "params": {"type": ["object", "null"]},
                                "params_digest": DIGEST,
                                "requested_at": STR,
                                "decided_by": STR,
                                "decided_at": {"type": ["string", "null"]},
                                "permit_id": {"type": ["string", "null"]},
                                "expires_at": {"type": ["string", "null"]},
                            },
                            ["approval_id", "status", "action", "provider", "params_digest"],
                        ),
                    ),
                    **ERRORS,
                },
            ),
        },
        "/api/v1/approvals/{approval_id}/decision": {
            "parameters": [{"name": "approval_id", "in": "path", "required": True, "schema": STR}],
            "post": _op(
                "Approve or deny exactly what was reviewed (approver token within its scope, "
                "or console user with decide permission)",
                _obj(
                    {
                        "decision": {"enum": ["approve", "deny"]},
                        "ttl_seconds": {"type": "integer", "minimum": 1, "maximum": 604800},
                        "params_digest": DIGEST,
                    },
                    ["decision", "params_digest"],
                ),
                {
                    "200": (
                        "Decided",
                        _obj(
                            {
                                "approval_id": STR,
                                "status": STR,
                                "permit_id": {"type": ["string", "null"]},
                                "expires_at": {"type": ["string", "null"]},
                            },
                            ["status", "permit_id", "expires_at"],
                        ),
                    ),
                    "403": ("A host token may not decide", None),
                    "409": ("already_decided, or digest_mismatch (recorded)", None),
                    **ERRORS,
                },
            ),
        },
        "/api/v1/permits/{permit_id}/revoke": {
            "parameters": [{"name": "permit_id", "in": "path", "required": True, "schema": STR}],
            "post": _op(
                "Revoke a permit (guards the future: a consumed permit stays consumed)",
                _obj({"reason": STR}, ["reason"]),
                {
                    "200": (
                        "Revoked, or recorded as ignored",
                        _obj(
                            {"permit_id": STR, "status": STR, "revoked": {"type": "boolean"}},
                            ["permit_id", "status", "revoked"],
                        ),
                    ),
                    **ERRORS,
                },
            ),
        },
        "/api/v1/operations/{key}/dispatch": {
            "parameters": key_param,
            "post": _op(
                "Consume the permit and create the one dispatch",
                _obj({"worker": NAME, "params_digest": DIGEST}, ["worker", "params_digest"]),
                {
                    "200": (
                        "This caller holds the dispatch",
                        _obj(
                            {"fencing_token": STR, "permit_id": STR, "lease_expires_at": STR},
                            ["fencing_token", "permit_id"],
                        ),
                    ),
                    "409": (
                        "Refused: not_authorized, action_mismatch, expired, revoked or "
                        "already_consumed (with execution_state)",
                        None,
                    ),
                    **ERRORS,
                },
            ),
        },
        "/api/v1/operations/{key}/heartbeat": {
            "parameters": key_param,
            "post": _op(
                "Extend the dispatch lease",
                _obj({"fencing_token": STR}, ["fencing_token"]),
                {
                    "200": ("Lease extended", _obj({"lease_expires_at": STR}, [])),
                    "409": ("stale_fencing_token or lease_lost", None),
                    **ERRORS,
                },
            ),
        },
        "/api/v1/operations/{key}/result": {
            "parameters": key_param,
            "post": _op(
                "Report the outcome (the first report wins)",
                _obj(
                    {
                        "fencing_token": STR,
                        "outcome": {"enum": ["committed", "failed"]},
                        "provider_reference": STR,
                    },
                    ["fencing_token", "outcome"],
                ),
                {
                    "200": (
                        "Recorded (applied false: a later duplicate)",
                        _obj(
                            {"applied": {"type": "boolean"}, "state": STR, "receipt": STR},
                            ["applied", "state", "receipt"],
                        ),
                    ),
                    "409": ("stale_fencing_token", None),
                    **ERRORS,
                },
            ),
        },
        "/api/v1/operations/{key}/resume": {
            "parameters": key_param,
            "post": _op(
                "What a fresh worker should do; never a second dispatch",
                _obj({"worker": NAME}, ["worker"]),
                {
                    "200": (
                        "Decision",
                        _obj(
                            {
                                "decision": {
                                    "enum": [
                                        "wait",
                                        "dispatch",
                                        "in_progress",
                                        "released",
                                        "unknown",
                                        "reconcile",
                                        "closed",
                                    ]
                                },
                                "state": STR,
                                "recovered": {"type": "boolean"},
                                "fencing_token": STR,
                                "retry_after": {
                                    "type": "integer",
                                    "minimum": 1,
                                    "description": (
                                        "Seconds until asking again is worth it: the "
                                        "operation's next lookup is not due, another "
                                        "lookup of it is queued or running (decision "
                                        "in_progress), or its provider's in-request "
                                        "lookups are all busy."
                                    ),
                                },
                            },
                            ["decision", "state", "recovered"],
                        ),
                    ),
                    **ERRORS,
                },
            ),
        },
        "/api/v1/providers/{name}/callbacks": {
            "parameters": [{"name": "name", "in": "path", "required": True, "schema": STR}],
            "post": _op(
                "Signed asynchronous provider notification (X-Provider-Signature: hex "
                "HMAC-SHA256 of the raw body)",
                _obj(
                    {
                        "operation_key": KEY,
                        "status": {"enum": ["committed", "failed"]},
                        "params_digest": DIGEST,
                        "reference": STR,
                        "sequence": {"type": "integer", "minimum": 0, "maximum": 2**53 - 1},
                    },
                    ["operation_key", "status", "params_digest", "reference", "sequence"],
                ),
                {
                    "200": (
                        "Applied, or recorded as stale (applied false, with reason)",
                        _obj(
                            {"applied": {"type": "boolean"}, "state": STR, "reason": STR},
                            ["applied", "state"],
                        ),
                    ),
                    "401": ("bad_signature", None),
                    "404": ("unknown_provider or unknown_operation", None),
                    **{k: v for k, v in ERRORS.items() if k in {"400", "422"}},
                },
                security=False,
            ),
        },
    }
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
            "schemas": {
                "Error": _obj(
                    {"error": {"enum": ERROR_CODES}, "message": STR},
                    ["error", "message"],
                )
                | {"additionalProperties": True},
            },
        },
    }
