"""Fetch-and-authorise: every console view asks ``console.views.access`` for what it is
about, and answers 404 for what the user may not see, 403 for what they may not do."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from audit.models import AuditEvent
from tests.support.console import client_for

VIEWS = Path(__file__).resolve().parents[2] / "console" / "views"
# The selectors that fetch one object by its id for a user: only the access helpers call them.
FETCHES = {
    "operation_for_user",
    "approval_for_caller",
    "reconciliation_request_for_user",
    "provider_permissions",
    "user_roles",
    "providers_supervised",
}


def _names_called(path: Path) -> set[str]:
    called = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            function = node.func
            name = function.attr if isinstance(function, ast.Attribute) else None
            if isinstance(function, ast.Name):
                name = function.id
            called.add(name or "")
    return called


def test_only_the_access_helpers_fetch_an_object_for_a_user() -> None:
    # What a page offers (``actions_context``, the four-eyes queue's approvable rows) and
    # the signing step's JSON answer read permissions too; none of them fetches by id.
    allowed = {
        "access.py": FETCHES,
        "reconcile.py": {"provider_permissions", "providers_supervised"},
    }
    found = {
        path.name: sorted(_names_called(path) & (FETCHES - allowed.get(path.name, set())))
        for path in VIEWS.glob("*.py")
    }
    assert {name: calls for name, calls in found.items() if calls} == {}


@pytest.mark.django_db
def test_a_viewers_claim_is_refused_once_on_the_record(viewer, stuck):
    operation = stuck.unknown("op-1")
    response = client_for(viewer).post(f"/operations/{operation.key}/claim")
    assert response.status_code == 403
    [refused] = AuditEvent.objects.filter(operation_key=operation.key, kind="operator_refused")
    assert refused.data["action"] == "claim"


@pytest.mark.django_db
def test_another_providers_user_gets_404_for_a_claim_and_nothing_is_recorded(outsider, stuck):
    operation = stuck.unknown("op-1")
    response = client_for(outsider).post(f"/operations/{operation.key}/claim")
    assert response.status_code == 404
    assert not AuditEvent.objects.filter(operation_key=operation.key, kind="operator_refused")


@pytest.mark.django_db
def test_the_policy_page_is_for_deciders_and_supervisors_only(viewer, supervisor):
    assert client_for(viewer).get("/policy/").status_code == 403
    assert client_for(supervisor).get("/policy/").status_code == 200
