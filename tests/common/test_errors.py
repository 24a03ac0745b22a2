"""One vocabulary of errors: every code carries its status, and every layer answers it."""

from __future__ import annotations

import uuid

import pytest

from common.actors import Actor
from common.errors import ErrorCode, SettleError
from recovery.contract import ERROR_CODES
from recovery.openapi import openapi_document
from recovery.services.errors import Forbidden, NotFound, RecoveryError
from recovery.services.locking import OperationRef, operation_read
from recovery.services.operator import operator_lookup
from tests.support.console import client_for

STATUSES = {400, 401, 403, 404, 405, 409, 413, 415, 422, 429, 500, 503}


@pytest.mark.parametrize("code", list(ErrorCode))
def test_every_code_has_a_status_and_a_message(code: ErrorCode) -> None:
    assert code.status in STATUSES
    assert code.message and code.message == code.message.strip()
    assert code.value == code.name.lower()


def test_the_documents_codes_are_exactly_the_members_marked_for_the_api() -> None:
    enum = openapi_document()["components"]["schemas"]["Error"]["properties"]["error"]["enum"]
    assert enum == ERROR_CODES == [code.value for code in ErrorCode if code.api]
    assert {ErrorCode(value) for value in enum} == {code for code in ErrorCode if code.api}


def test_an_error_says_its_codes_message_unless_given_one() -> None:
    assert RecoveryError(ErrorCode.STALE_STATE).message == ErrorCode.STALE_STATE.message
    assert RecoveryError(ErrorCode.STALE_STATE, "moved on").message == "moved on"
    assert RecoveryError(ErrorCode.STALE_STATE).status == 409


def test_every_layers_error_is_one_settle_error() -> None:
    assert Forbidden("no").code is ErrorCode.FORBIDDEN
    assert isinstance(NotFound(ErrorCode.UNKNOWN_OPERATION), SettleError)


@pytest.mark.django_db
def test_an_unknown_operation_is_404_in_the_service_the_api_and_the_console(
    host, host_api, operator
) -> None:
    with pytest.raises(SettleError) as refused:
        operation_read(OperationRef(key="op-absent", host=host))
    assert (refused.value.code, refused.value.status) == (ErrorCode.UNKNOWN_OPERATION, 404)
    answer = host_api.get("/api/v1/operations/op-absent")
    assert (answer.status_code, answer.json()["error"]) == (404, "unknown_operation")
    page = client_for(operator).post("/operations/op-absent/lookup", {"version": 1})
    assert page.status_code == ErrorCode.UNKNOWN_OPERATION.status


@pytest.mark.django_db
def test_a_forbidden_call_is_403_in_the_service_the_api_and_the_console(
    stuck, viewer, host_api
) -> None:
    operation = stuck.unknown("op-1")
    with pytest.raises(SettleError) as refused:
        operator_lookup(
            operation=operation,
            version=operation.version,
            reason="x",
            actor=Actor.of("user", viewer),
        )
    assert (refused.value.code, refused.value.status) == (ErrorCode.FORBIDDEN, 403)
    # A host credential may not decide approvals.
    answer = host_api.post(f"/api/v1/approvals/{uuid.uuid4()}/decision", {"decision": "deny"})
    assert (answer.status_code, answer.json()["error"]) == (403, "forbidden")
    page = client_for(viewer).post(
        f"/operations/{operation.key}/lookup", {"version": operation.version, "reason": "x"}
    )
    assert page.status_code == ErrorCode.FORBIDDEN.status
