"""The OpenAPI 3.1 document of the host API, generated from ``recovery.contract``.

Served at /api/openapi.json. Each endpoint names its request model and, per status, its
response model; errors all share the ``Error`` schema. Nothing here restates a field.
The statuses an endpoint declares are those of the ``ErrorCode`` members it can answer
with, read from the enum (``recovery.api_endpoint``), and its links say which answer's
values the next call takes (what a fuzzer's stateful phase follows).
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, models_json_schema

from common.errors import ErrorCode
from recovery import contract, contract_parties, params_schema
from recovery.api_endpoint import PAGES, Endpoint, Link, endpoint_statuses

REF = params_schema.REF


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
        "Register an operation (idempotent per key); open its approval, and dispatch once a "
        "policy approved it, if asked",
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
        query=("wait",),
        codes=(E.UNKNOWN_OPERATION, E.INVALID_WAIT),
        errors={400: "invalid_wait"},
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
        "Exactly what would be approved (an approver within its scope, a console user "
        "who may view the provider's operations, or the host that opened it: to that host "
        "alone, while pending and addressed to its customer, the customer's link)",
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

_PARTY = {"party": "$response.body#/party"}
ENDPOINTS += [
    Endpoint(
        "/api/v1/parties/{party}/enrolments",
        "post",
        "requestPartyEnrolment",
        "A one-time link on which the party (your customer) enrols a passkey; deliver it "
        "inside your signed-in app (the body may be empty)",
        contract_parties.EnrolmentRequest,
        {201: ("The enrolment link (shown once)", contract_parties.EnrolmentLink)},
        parameters=("party",),
        links={201: {"party": ("getParty", _PARTY, None)}},
    ),
    Endpoint(
        "/api/v1/parties/{party}",
        "get",
        "getParty",
        "The party and its passkeys (removed ones too)",
        None,
        {200: ("The party", contract_parties.PartyPasskeys)},
        parameters=("party",),
        codes=(E.UNKNOWN_PARTY,),
        errors={404: "unknown_party: no such party for this host"},
    ),
    Endpoint(
        "/api/v1/parties/{party}/passkeys/{passkey_id}",
        "delete",
        "revokePartyPasskey",
        "Revoke one of the party's passkeys: it signs nothing from now on",
        None,
        {200: ("Removed, or removed already (removed false)", contract_parties.PasskeyRemoved)},
        parameters=("party", "passkey_id"),
        codes=(E.UNKNOWN_PARTY, E.UNKNOWN_PASSKEY),
        errors={404: "unknown_party, or unknown_passkey"},
    ),
]

# Requests whose body may be left out.
OPTIONAL_BODIES = (contract.OpenApprovalRequest, contract_parties.EnrolmentRequest)

QUERY_PARAMETERS = {
    "wait": (
        "While the operation awaits approval, hold the answer until the approval is "
        "decided (or expires), at most this many seconds; it may come at once where the "
        "server holds no more reads",
        {"type": "integer", "minimum": 1, "maximum": contract.OPERATION_WAIT_MAX},
    ),
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
    "party": contract.PARTY_PATTERN,
    "passkey_id": r"^[0-9]{1,18}$",
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
            "required": endpoint.request not in OPTIONAL_BODIES,
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
            "schemas": definitions["$defs"] | params_schema.params_value_schemas(),
        },
    }
