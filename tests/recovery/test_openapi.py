"""The OpenAPI document: valid OpenAPI 3.1, every route with its methods, every error code."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.test import Client
from django.urls import resolve
from openapi_spec_validator import validate

from approvals.services import Refusal
from common.errors import ErrorCode
from recovery import contract, urls
from recovery.openapi import openapi_document
from tests.support.contract import ContractViolation, response_check, route_template

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]

# Every `error` code a response under /api/ can carry (grepped from recovery/api.py,
# recovery/services/, approvals/services.py, common/canonical.py, console/services/,
# console/views/).
EMITTED = {
    # body parsing (api._json_body, canonical.strict_loads)
    "malformed_json",
    "duplicate_key",
    "non_finite_number",
    "too_deep",
    "invalid_body",
    "body_too_large",
    "unsupported_media_type",
    # field validation (contract.refusal)
    "unknown_field",
    "missing_field",
    "invalid_field",
    "invalid_params",
    "params_too_large",
    # credentials and permissions
    "unauthorized",
    "forbidden",
    "csrf_failed",
    "bad_signature",
    "method_not_allowed",
    # lookups
    "unknown_operation",
    "unknown_provider",
    "unknown_approval",
    "unknown_permit",
    # business refusals (services, approvals)
    "key_conflict",
    "invalid_state",
    "stale_state",
    "already_decided",
    "digest_mismatch",
    "invalid_ttl",
    "already_voted",
    "approval_expired",
    "proposer_excluded",
    "not_in_group",
    "passkey_required",
    "not_authorized",
    "action_mismatch",
    "expired",
    "revoked",
    "already_consumed",
    "stale_fencing_token",
    "lease_lost",
    # infrastructure (api.api_view, console.views)
    "database_unavailable",
    "not_found",
    "internal_error",
    # the rate limit and the history's pages (api._rate_limit, api._page_query)
    "rate_limited",
    "invalid_cursor",
    "invalid_page_size",
}
# Raised only by provider_configure, which the admin and `add_provider` call, and by the
# console's operator actions (recovery.services.operator) — never by the host API.
ADMIN_ONLY = {
    "stale_version",
    "lookup_in_flight",
    "invalid_adapter",
    "missing_path",
    "missing_url",
    "invalid_timeout",
    "invalid_lease",
    "invalid_name",
    "invalid_path",
    "invalid_url",
    "invalid_lookup_budget",
    "name_taken",
    "unknown_credential",
    "unknown_credential_kind",
    "empty_scope",
    # webhook endpoints (manage.py webhook, the admin) and redelivery (the console)
    "invalid_webhook_url",
    "invalid_webhook_events",
    "unresolvable_webhook_url",
    "private_webhook_url",
    "unknown_webhook_endpoint",
    "unknown_webhook_message",
    "unknown_host",
    # roles (manage.py grant)
    "unknown_role",
    "unknown_permission",
    # the console's operator actions (recovery.services.reconcile, claims)
    "not_stranded",
    "not_allowed",
    "unknown_action",
    "evidence_matches",
    "four_eyes_required",
    "request_pending",
    "self_approval",
    "request_invalidated",
    "claimed",
    "not_claimed",
    # bulk work from the console (console.services.bulk, and its confirm in reconcile)
    "not_backed",
    "empty_selection",
    "selection_too_large",
    "reason_required",
    "unknown_batch",
    # a supervisor resolving an audit alarm (console.services.audit_trail)
    "resolution_required",
    "resolution_too_long",
    "unknown_alarm",
    "already_resolved",
    # an audit export job from the console (console.services.audit_export)
    "invalid_format",
    "unknown_export",
    # a decision signed with a passkey (the console's; the API's decisions carry none)
    "signature_invalid",
}
# CanonicalError codes that reach the API only as the `reason` of invalid_params.
REASON_ONLY = {"integer_out_of_range"}

# A code written as text where an error is raised or answered: every one is an ErrorCode.
RAISERS = re.compile(
    r"(?:ApiError\(|error_response\(|RecoveryError\(|NotFound\(|Invalid\(|SettleError\("
    r"|ApprovalError\(|CanonicalError\(|_uuid\(\w+,|missing=)\s*(?:\d+,\s*)?\"([a-z_]+)\""
)
JSON_ERRORS = re.compile(r"\{\"error\": \"([a-z_]+)\"")
MEMBERS = re.compile(r"\bErrorCode\.([A-Z_]+)\b")
SOURCES = [
    "recovery/api.py",
    "recovery/contract.py",
    *sorted(str(path.relative_to(ROOT)) for path in (ROOT / "recovery/services").glob("*.py")),
    "common/canonical.py",
    "approvals/services.py",
    *sorted(str(path.relative_to(ROOT)) for path in (ROOT / "console/services").glob("*.py")),
    *sorted(str(path.relative_to(ROOT)) for path in (ROOT / "console/views").glob("*.py")),
]
SHIPPED = ["approvals", "audit", "common", "console", "dbsql", "monitoring", "recovery", "webhooks"]


def scanned_codes() -> set[str]:
    """The codes the API's sources name, as members (or as text, which a test refuses)."""
    codes: set[str] = set()
    for name in SOURCES:
        text = (ROOT / name).read_text()
        codes |= {ErrorCode[member].value for member in MEMBERS.findall(text)}
        codes |= set(RAISERS.findall(text)) | set(JSON_ERRORS.findall(text))
    codes |= {str(value) for key, value in vars(Refusal).items() if key.isupper()}
    return codes


def documented_path(route: str) -> str:
    return route_template("api/" + route)


def sample_url(route: str) -> str:
    return "/api/" + re.sub(r"<(?:\w+:)?(\w+)>", "sample", route)


API_ROUTES = [p for p in urls.urlpatterns if p.name != "openapi"]


@pytest.fixture(scope="module")
def document() -> dict:
    return openapi_document()


def test_the_served_document_is_valid_openapi_3_1(client: Client):
    response = client.get("/api/openapi.json")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    served = response.json()
    assert served == openapi_document()
    assert served["openapi"].startswith("3.1")
    validate(served)


@pytest.mark.parametrize("pattern", API_ROUTES, ids=lambda p: str(p.pattern))
def test_every_api_route_is_a_documented_path(document, pattern):
    route = str(pattern.pattern)
    path = documented_path(route)
    assert resolve(sample_url(route)).func is pattern.callback
    assert path in document["paths"], f"{path} is served but not documented"
    item = document["paths"][path]
    in_route = set(re.findall(r"<(?:\w+:)?(\w+)>", route))
    declared = {p["name"] for p in item.get("parameters", []) if p["in"] == "path"}
    assert declared == in_route


@pytest.mark.parametrize("pattern", API_ROUTES, ids=lambda p: str(p.pattern))
def test_every_method_a_route_allows_is_documented(document, client: Client, pattern):
    """The API answers any other method with 405 and the Allow header: that is the truth."""
    route = str(pattern.pattern)
    response = client.generic("TRACE", sample_url(route))
    assert response.status_code == 405
    allowed = {m.strip().lower() for m in response["Allow"].split(",")}
    item = document["paths"][documented_path(route)]
    documented = {m for m in item if m in {"get", "post", "put", "patch", "delete"}}
    assert documented == allowed


def test_every_documented_path_is_served(document):
    served = {documented_path(str(p.pattern)) for p in API_ROUTES}
    assert set(document["paths"]) == served


def test_every_error_code_the_api_can_emit_is_in_the_error_enum(document):
    enum = set(document["components"]["schemas"]["Error"]["properties"]["error"]["enum"])
    assert sorted(EMITTED - enum) == []


def test_the_emitted_list_matches_the_codes_in_the_source():
    """A new error code in the source must be added to EMITTED (and to the enum)."""
    assert scanned_codes() - ADMIN_ONLY - REASON_ONLY == EMITTED


def test_the_error_enum_is_exactly_the_codes_marked_for_the_api(document):
    enum = document["components"]["schemas"]["Error"]["properties"]["error"]["enum"]
    assert enum == [code.value for code in ErrorCode if code.api]
    assert set(enum) == EMITTED


def test_every_code_in_the_source_is_a_member():
    assert scanned_codes() - {code.value for code in ErrorCode} == set()
    assert {code.value for code in ErrorCode if not code.api} >= ADMIN_ONLY | REASON_ONLY


def test_no_raiser_is_given_a_code_as_text():
    """Codes are named as ErrorCode members; only common/errors.py spells their text."""
    found = {}
    for app in SHIPPED:
        for path in (ROOT / app).rglob("*.py"):
            name = str(path.relative_to(ROOT))
            if "/migrations/" in name:
                continue
            text = path.read_text()
            literal = RAISERS.findall(text) + JSON_ERRORS.findall(text)
            if literal:
                found[name] = literal
    assert found == {}


def test_the_error_schema_requires_error_and_message(document):
    schema = document["components"]["schemas"]["Error"]
    assert set(schema["required"]) == {"error", "message"}
    assert schema["properties"]["message"] == {"type": "string"}


def test_every_operation_documents_its_errors_with_the_error_schema(document):
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method == "parameters":
                continue
            for status, response in operation["responses"].items():
                if int(status) < 400:
                    continue
                schema = response["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/Error"}, (path, method, status)


# -- the contract: one definition, and every response checked against it -----------


def test_request_schemas_are_the_models_the_api_validates_with(document):
    schemas = document["components"]["schemas"]
    for name in ("RegisterRequest", "DispatchRequest", "CallbackRequest", "DecisionRequest"):
        model = getattr(contract, name)
        assert set(schemas[name]["properties"]) == set(model.model_fields), name
        assert schemas[name]["additionalProperties"] is False
    digest = schemas["DispatchRequest"]["properties"]["params_digest"]
    assert digest["pattern"] == contract.DIGEST_PATTERN
    assert schemas["RegisterRequest"]["properties"]["key"]["pattern"] == contract.KEY_PATTERN


def test_every_success_response_has_a_schema_of_its_own(document):
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method == "parameters":
                continue
            for status, response in operation["responses"].items():
                schema = response["content"]["application/json"]["schema"]
                if int(status) < 400:
                    assert schema != {"$ref": "#/components/schemas/Error"}, (path, status)


def _json(body: dict) -> bytes:
    return json.dumps(body).encode()


def test_the_response_check_refuses_an_undocumented_status():
    with pytest.raises(ContractViolation, match="not documented"):
        response_check("GET", "/api/v1/operations/op-1", 418, "application/json", b"{}")


def test_the_response_check_refuses_a_body_its_schema_refuses():
    resumed = {"decision": "resume-later", "state": "unknown", "recovered": False}
    with pytest.raises(ContractViolation, match="is not one of"):
        response_check(
            "POST", "/api/v1/operations/op-1/resume", 200, "application/json", _json(resumed)
        )
    with pytest.raises(ContractViolation, match="Additional properties"):
        response_check(
            "POST",
            "/api/v1/operations/op-1/heartbeat",
            200,
            "application/json",
            _json({"lease_expires_at": "2026-01-01T00:00:00+00:00", "extra": 1}),
        )
    error = {"error": "no_such_code", "message": "x"}
    with pytest.raises(ContractViolation, match="is not one of"):
        response_check("POST", "/api/v1/operations", 409, "application/json", _json(error))


def test_the_response_check_accepts_what_the_api_answers(flow):
    # The check runs on every response a test receives (tests/conftest.py); here, once
    # by hand, to show what it checks against.
    response = flow.host_api.post("/api/v1/operations/nope/resume", {"worker": "w1"})
    pointer = response_check(
        "POST",
        "/api/v1/operations/nope/resume",
        response.status_code,
        response["Content-Type"],
        response.content,
    )
    assert (response.status_code, pointer) == (404, _pointer_of("resume", "404"))


def _pointer_of(endpoint: str, status: str) -> str:
    return (
        f"#/paths/~1api~1v1~1operations~1{{key}}~1{endpoint}/post/responses/{status}"
        "/content/application~1json/schema"
    )
