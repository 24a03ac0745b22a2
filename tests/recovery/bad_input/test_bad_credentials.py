"""Wrong methods, credentials and permissions: 401, 403 or 405, nothing written."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from guardian.shortcuts import assign_perm

from approvals.models import Approval
from harness.providers import digest_of
from recovery.models import Provider
from recovery.permissions import ProviderPermission
from tests.support.bad_input import (
    BEARER,
    ENDPOINTS,
    HOST_ONLY,
    POSTS,
    assert_error,
    assert_unchanged,
    covering,
    snapshot,
)
from tests.support.flow import PARAMS

pytestmark = pytest.mark.django_db


# -- methods, credentials, permissions ----------------------------------------------------


@pytest.mark.parametrize(
    ("name", "method"),
    covering(POSTS, ["GET", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
    + [pytest.param("operation", m, id=f"operation-{m}") for m in ("POST", "PUT", "DELETE")],
)
def test_a_wrong_method_is_405_with_an_allow_header(world, name, method):
    endpoint = ENDPOINTS[name]
    before = snapshot()
    response = world.send(endpoint, method=method)
    assert response.status_code == 405
    assert response["Allow"] == endpoint.method
    if method != "HEAD":
        assert_error(response, 405, "method_not_allowed")
    assert_unchanged(before)


@pytest.mark.parametrize(
    ("name", "authorization"),
    covering(
        BEARER,
        [
            None,
            "",
            "Bearer",
            "Bearer    ",
            "Basic dXNlcjpwYXNz",
            "Token sth_abc",
            "Bearer garbage",
            "Bearer sth_" + "A" * 43,
            "Bearer sta_" + "A" * 43,
            "Bearer " + "x" * 5000,
            "Bearer \u00e9t\u00e9",
        ],
    ),
)
def test_no_garbage_or_unknown_bearer_token_is_401(world, name, authorization):
    endpoint = ENDPOINTS[name]
    before = snapshot()
    if authorization == "":
        authorization = " "
    response = world.send(endpoint, authorization=authorization)
    assert_error(response, 401, "unauthorized")
    assert_unchanged(before)


@pytest.mark.parametrize("caller", ["host", "other_host"])
def test_a_host_token_may_not_decide_an_approval(world, caller):
    before = snapshot()
    response = world.send(ENDPOINTS["decision"], caller=caller)
    assert_error(response, 403, "forbidden")
    assert_unchanged(before)
    assert Approval.objects.get(pk=world.approval_id).status == "pending"


@pytest.mark.parametrize("name", HOST_ONLY)
def test_an_approver_token_may_not_act_as_a_host(world, name):
    before = snapshot()
    assert_error(world.send(ENDPOINTS[name], caller="approver"), 403, "forbidden")
    assert_unchanged(before)


@pytest.fixture
def console_user(db):
    return get_user_model().objects.create_user(username="carol", password="pw-not-used")


def _console_decision(world: Any, user: Any, *, csrf_checks: bool = False) -> tuple[Client, Any]:
    """A console session posting an approval decision; the client and its answer."""
    client = Client(enforce_csrf_checks=csrf_checks)
    client.force_login(user)
    response = client.post(
        f"/api/v1/approvals/{world.approval_id}/decision",
        data=json.dumps({"decision": "approve", "params_digest": digest_of(PARAMS)}),
        content_type="application/json",
    )
    return client, response


def test_a_console_session_without_its_csrf_token_is_refused(world, console_user):
    before = snapshot()
    _, response = _console_decision(world, console_user, csrf_checks=True)
    assert_error(response, 403, "csrf_failed")
    assert_unchanged(before)


def test_a_console_user_who_may_view_but_not_decide_is_forbidden(world, console_user):
    assign_perm(
        ProviderPermission.VIEW_OPERATIONS.perm, console_user, Provider.objects.get(name="orders")
    )
    before = snapshot()
    client, response = _console_decision(world, console_user)
    assert_error(response, 403, "forbidden")
    assert_unchanged(before)
    # Seeing what it would approve is viewing: allowed.
    shown = client.get(f"/api/v1/approvals/{world.approval_id}")
    assert (shown.status_code, shown.json()["status"]) == (200, "pending")


def test_to_a_console_user_of_no_provider_an_approval_does_not_exist(world, console_user):
    before = snapshot()
    client, response = _console_decision(world, console_user)
    assert_error(response, 404, "unknown_approval")
    assert_error(client.get(f"/api/v1/approvals/{world.approval_id}"), 404, "unknown_approval")
    assert_unchanged(before)
