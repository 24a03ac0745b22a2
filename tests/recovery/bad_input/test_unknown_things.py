"""Unknown and foreign things (another host's operation, an unknown id or URL) are 404."""

from __future__ import annotations

import uuid

import pytest

from approvals.models import Permit
from tests.support.bad_input import (
    BY_KEY,
    ENDPOINTS,
    assert_error,
    assert_unchanged,
    covering,
    snapshot,
)

pytestmark = pytest.mark.django_db


# -- unknown and foreign things ---------------------------------------------------------


@pytest.mark.parametrize("name", BY_KEY)
def test_another_hosts_operation_is_unknown(world, name):
    endpoint = ENDPOINTS[name]
    before = snapshot()
    response = world.send(endpoint, caller="other_host")
    assert_error(response, 404, "unknown_operation")
    assert_unchanged(before)


def test_another_hosts_permit_is_unknown(world):
    before = snapshot()
    response = world.send(ENDPOINTS["revoke"], caller="other_host")
    assert_error(response, 404, "unknown_permit")
    assert_unchanged(before)
    assert Permit.objects.get(pk=world.permit_id).status == "consumed"


@pytest.mark.parametrize(
    ("name", "key"),
    covering(
        BY_KEY,
        [
            "op-404",
            "bad%20key",
            "-op-1",
            "op-1%0A",
            "op-1%00",
            "op%E2%80%8B1",
            "%ED%A0%80",
            "k" * 201,
        ],
    ),
)
def test_an_unknown_or_impossible_operation_key_is_404(world, name, key):
    before = snapshot()
    response = world.send(ENDPOINTS[name], key=key)
    assert_error(response, 404, "unknown_operation")
    assert_unchanged(before)


@pytest.mark.parametrize(
    "approval_id",
    [
        pytest.param(str(uuid.uuid4()), id="unknown"),
        "not-a-uuid",
        "1234",
        "%00",
        "0" * 33,
        "g" * 32,
    ],
)
def test_an_unknown_or_non_uuid_approval_id_is_404(world, approval_id):
    before = snapshot()
    response = world.send(ENDPOINTS["decision"], approval_id=approval_id)
    assert_error(response, 404, "unknown_approval")
    assert_unchanged(before)


@pytest.mark.parametrize("caller", ["host", "approver"])
@pytest.mark.parametrize(
    "permit_id", [pytest.param(str(uuid.uuid4()), id="unknown"), "not-a-uuid", "%00"]
)
def test_an_unknown_or_non_uuid_permit_id_is_404(world, caller, permit_id):
    before = snapshot()
    response = world.send(ENDPOINTS["revoke"], caller=caller, permit_id=permit_id)
    assert_error(response, 404, "unknown_permit")
    assert_unchanged(before)


def test_registering_at_an_unknown_provider_is_404(world):
    body = {**ENDPOINTS["register"].body(world), "provider": "nowhere"}
    before = snapshot()
    assert_error(world.send(ENDPOINTS["register"], body=body), 404, "unknown_provider")
    assert_unchanged(before)


@pytest.mark.parametrize("provider_name", ["nowhere", "a%00b", "p" * 101, "%20", "HP"])
def test_a_callback_to_an_unknown_provider_is_404(world, provider_name):
    before = snapshot()
    response = world.send(ENDPOINTS["callbacks"], provider=provider_name)
    assert_error(response, 404, "unknown_provider")
    assert_unchanged(before)


@pytest.mark.parametrize("operation_key", ["op-404", "op-1"])
def test_a_signed_callback_for_an_operation_the_provider_does_not_hold_is_404(world, operation_key):
    """op-1 exists, but at another provider: a provider only speaks for its own."""
    body = {**ENDPOINTS["callbacks"].body(world), "operation_key": operation_key}
    before = snapshot()
    response = world.send(ENDPOINTS["callbacks"], body=body)
    assert_error(response, 404, "unknown_operation")
    assert_unchanged(before)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/"),
        ("GET", "/api/v1/"),
        ("GET", "/api/v1/operations/"),
        ("POST", "/api/v1/operations/"),
        ("GET", "/api/v2/operations"),
        ("POST", "/api/v1/operations/op-1/approve"),
        ("POST", "/api/v1/operations/op-1/dispatch/"),
        ("GET", "/api/v1/operations/op-1/result/extra"),
        ("POST", "/api/v1/approvals/x/decide"),
        ("GET", "/api/v1/providers/hp"),
        ("DELETE", "/api/nope"),
    ],
)
def test_an_unknown_url_under_api_is_a_json_404(world, method, path):
    before = snapshot()
    response = world.client.generic(
        method, path, data=b"{}", HTTP_AUTHORIZATION=f"Bearer {world.host.token}"
    )
    assert_error(response, 404, "not_found")
    assert_unchanged(before)
