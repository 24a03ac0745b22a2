"""The OpenAPI document: valid OpenAPI 3.1, every route with its methods, every error code."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import resolve
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate

import recovery.api
from approvals.services.errors import Refusal
from common.canonical import CanonicalError, canonical_params
from common.errors import ErrorCode
from recovery import api_endpoint, contract, openapi, urls
from recovery.openapi import openapi_document
from tests.support.contract import ContractViolation, response_check, route_template

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]

# Every `error` code a response under /api/ can carry (grepped from recovery/api.py,
# recovery/services/, approvals/services/, common/canonical.py, console/services/,
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
    "unknown_party",
    "unknown_passkey",
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
    # an approval addressed to a host's customer
    "party_required",
    "customer_required",
    "contact_not_allowed",
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
    "invalid_wait",
}
# Raised only by provider_configure, which the admin and `add_provider` call, and by the
# console's operator actions (recovery.services.operator) — never by the host API.
ADMIN_ONLY = {
    "invalid_mcp_secret",
    "secret_too_long",
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
    # bulk work from the console (bulk.services, and its confirm in reconcile)
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
    # a customer's passkey enrolment page (customers.views.enrol), never the host API
    "enrolment_unknown",
    "enrolment_used",
    "enrolment_expired",
    "registration_invalid",
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
    "recovery/api_parties.py",
    "recovery/query.py",
    "recovery/contract.py",
    *sorted(str(path.relative_to(ROOT)) for path in (ROOT / "recovery/services").glob("*.py")),
    "common/canonical.py",
    *sorted(str(path.relative_to(ROOT)) for path in (ROOT / "approvals/services").glob("*.py")),
    *sorted(str(path.relative_to(ROOT)) for path in (ROOT / "console/services").glob("*.py")),
    *sorted(str(path.relative_to(ROOT)) for path in (ROOT / "console/views").glob("*.py")),
]
SHIPPED = [
    "approvals",
    "audit",
    "common",
    "console",
    "customers",
    "dbsql",
    "monitoring",
    "recovery",
    "settle",
    "webhooks",
]


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


# -- each operation's statuses: those of every code its view can answer with -----------

FIRST_PARTY = ("recovery.", "approvals.", "policies.", "common.", "identity.")
CALLS = re.compile(r"\b(?:(\w+)\.)?(\w+)\(")
# Caller checks in api_view that a signed endpoint (no bearer token) never reaches.
BEARER_ONLY = {"_authenticate", "_rate_limit"}


def _first_party(function: object) -> bool:
    return inspect.isfunction(function) and function.__module__.startswith(FIRST_PARTY)


def codes_reached(function: Any, *, skip: frozenset[str] = frozenset()) -> set[ErrorCode]:
    """The ErrorCode members named in ``function`` and in every first-party function it
    calls by name (``name(`` or ``module.name(``), transitively."""
    found: set[ErrorCode] = set()
    pending = [inspect.unwrap(function)]
    seen: set[Any] = set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        text = inspect.getsource(current)
        found |= {ErrorCode[member] for member in MEMBERS.findall(text)}
        for owner, name in CALLS.findall(text):
            if name in skip:
                continue
            target = current.__globals__.get(owner or name)
            if owner:
                target = getattr(target, name, None) if inspect.ismodule(target) else None
            if target is not None and _first_party(inspect.unwrap(target)):
                pending.append(inspect.unwrap(target))
    return found


def test_every_operation_declares_the_status_of_every_code_its_view_can_answer(document):
    """Walks each view, the api_view around it and every first-party function they call:
    a code named there (an api one) whose status its operation does not declare fails."""
    missing = {}
    for pattern in API_ROUTES:
        path = documented_path(str(pattern.pattern))
        for method, operation in document["paths"][path].items():
            if method == "parameters":
                continue
            signed = operation.get("security") == []
            around = codes_reached(
                recovery.api.api_view, skip=frozenset(BEARER_ONLY if signed else ())
            )
            if signed:
                around.discard(ErrorCode.RATE_LIMITED)  # only answered, never raised, there
            # The view's own decorator is api_view, walked above as this caller meets it.
            view = codes_reached(pattern.callback, skip=frozenset({"api_view"}))
            codes = {c for c in view | around if c.api}
            undeclared = sorted(
                f"{code.value} ({code.status})"
                for code in codes
                if str(code.status) not in operation["responses"]
            )
            if undeclared:
                missing[f"{method.upper()} {path}"] = undeclared
    assert missing == {}


def test_the_walk_sees_the_codes_a_view_answers_with():
    """The walk above reaches into services: the decision's refusals, the dispatch's."""
    decision = codes_reached(recovery.api.approval_decision_view)
    assert {ErrorCode.ALREADY_DECIDED, ErrorCode.DIGEST_MISMATCH, ErrorCode.INVALID_TTL} <= decision
    assert ErrorCode.MISSING_FIELD in decision  # through _parse and contract.refusal
    assert ErrorCode.ALREADY_CONSUMED in codes_reached(recovery.api.operation_dispatch)


def test_every_write_declares_every_status_a_service_refusal_has(document):
    """A refusal added to the enum later (``api``) is declared on every write with no edit."""
    statuses = {str(code.status) for code in api_endpoint.SERVICE}
    for endpoint in openapi.ENDPOINTS:
        if endpoint.writes:
            responses = document["paths"][endpoint.path][endpoint.method]["responses"]
            assert statuses <= set(responses), endpoint.operation_id


def test_every_operation_declares_400_401_403_404_422_429_as_the_code_answers_them(document):
    for endpoint in openapi.ENDPOINTS:
        responses = document["paths"][endpoint.path][endpoint.method]["responses"]
        expected = {"404", "405", "500", "503"}
        if not endpoint.signed:
            expected |= {"401", "403", "429"}
        if endpoint.body:
            expected |= {"400", "413", "415", "422"}
        assert expected <= set(responses), endpoint.operation_id
        if endpoint.signed:
            assert "403" not in responses and "429" not in responses


# -- params: the schema says what common.canonical refuses --------------------------


def nested(levels: int) -> Any:
    """A value with ``levels`` levels of objects and arrays (alternating), 1 inside."""
    value: Any = 1
    for level in range(levels):
        value = [value] if level % 2 else {"k": value}
    return value


@pytest.fixture(scope="module")
def params_valid(document) -> Any:
    validator = Draft202012Validator(
        {**document, "$ref": "#/components/schemas/RegisterRequest/properties/params"}
    )
    return validator.is_valid


SAFE = 2**53 - 1


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"n": SAFE, "m": -SAFE, "f": 1.5, "z": -0.0, "t": True, "x": None},
        {"s": "text é \U0001f600", "é": [1, "two", {"three": 3.0}]},
        {"deep": nested(9)},  # ten levels with params itself
    ],
)
def test_params_the_schema_allows_are_accepted(params_valid, params):
    assert params_valid(params)
    canonical_params(params)


@pytest.mark.parametrize(
    "params",
    [
        {"n": SAFE + 1},
        {"n": -SAFE - 1},
        {"n": float(2**53)},
        {"a": [{"b": 2**60}]},
        {"s": "a\x00b"},
        {"a\x00": 1},
        {"a": {"b\x00": 1}},
        {"deep": nested(10)},  # eleven levels
        [],
        "text",
    ],
)
def test_params_the_server_refuses_are_refused_by_the_schema(params_valid, params):
    assert not params_valid(params)
    with pytest.raises(CanonicalError):
        canonical_params(params)


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params=st.dictionaries(st.text(max_size=3), JSON, max_size=4))
def test_params_the_schema_allows_are_never_refused(params_valid, params):
    """What the fuzzer relies on: schema-valid params always have a canonical form."""
    if params_valid(params):
        canonical_params(params)


# -- links --------------------------------------------------------------------------


def test_every_link_names_an_operation_and_its_parameters(document):
    operations = {
        operation["operationId"]: (path, item, operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
        if method != "parameters"
    }
    links = 0
    for _, _, operation in operations.values():
        for response in operation["responses"].values():
            for name, link in response.get("links", {}).items():
                links += 1
                _, item, target = operations[link["operationId"]]
                declared = {p["name"] for p in item.get("parameters", [])}
                assert set(link["parameters"]) <= declared, name
                body = target.get("requestBody", {}).get("content", {})
                if "requestBody" in link:
                    ref = body["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
                    fields = document["components"]["schemas"][ref]["properties"]
                    assert set(link["requestBody"]) <= set(fields), name
    assert links >= 10


def test_a_registration_links_to_what_a_host_does_with_its_key(document):
    links = document["paths"]["/api/v1/operations"]["post"]["responses"]["201"]["links"]
    targets = {link["operationId"] for link in links.values()}
    assert {"openApproval", "dispatchOperation", "resumeOperation", "reportResult"} <= targets
    opened = document["paths"]["/api/v1/operations/{key}/approvals"]["post"]["responses"]
    targets = {link["operationId"] for link in opened["201"]["links"].values()}
    assert targets == {"getApproval", "decideApproval"}


def test_every_request_body_is_the_model_its_view_parses(document):
    """POST .../approvals was once documented as taking no field while its view took
    ``proposer``: what the fuzzer sent as invalid, the server accepted."""
    for pattern in API_ROUTES:
        path = documented_path(str(pattern.pattern))
        parsed = set(
            re.findall(r"contract(?:_\w+)?\.(\w+Request)\b", inspect.getsource(pattern.callback))
        )
        for method, operation in document["paths"][path].items():
            if method == "parameters":
                continue
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            documented = {body["schema"]["$ref"].rsplit("/", 1)[1]} if body else set()
            assert documented == parsed, (method, path)
