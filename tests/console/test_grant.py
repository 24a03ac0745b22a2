"""Roles: three groups, and ``manage.py grant USER ROLE PROVIDER`` per provider, audited."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command

from audit.models import AuditEvent
from common.actors import COMMAND_LINE
from recovery.services.roles import OPERATOR, ROLES, SUPERVISOR

pytestmark = pytest.mark.django_db

ALL = set(SUPERVISOR)


def _grant(*args: str) -> str:
    out = StringIO()
    call_command("grant", *args, stdout=out)
    return out.getvalue()


def _held(user: User, provider) -> set[str]:
    user = User.objects.get(pk=user.pk)  # permission caches are per instance
    return {codename for codename in ALL if user.has_perm(f"recovery.{codename}", provider)}


def test_the_three_role_groups_exist_after_migrate_with_their_permissions():
    groups = {g.name: {p.codename for p in g.permissions.all()} for g in Group.objects.all()}
    assert groups == {name: set(codenames) for name, codenames in ROLES.items()}
    assert groups["viewer"] == {"view_operations"}
    assert "propose_reconciliations" in groups["operator"]
    assert "approve_reconciliations" not in groups["operator"]
    assert {"approve_reconciliations", "decide_approvals"} <= groups["supervisor"]


def test_grant_gives_the_roles_permissions_on_that_provider_only(provider, other_provider):
    olivia = User.objects.create_user("olivia")
    assert _grant("olivia", "operator", "orders") == (
        "olivia is operator on orders: " + ", ".join(sorted(OPERATOR)) + "\n"
    )
    assert _held(olivia, provider) == set(OPERATOR)
    assert _held(olivia, other_provider) == set()
    # Object permissions only: nothing model-wide, and no group membership.
    assert not User.objects.get(pk=olivia.pk).has_perm("recovery.view_operations")
    assert not olivia.groups.exists()


def test_grant_adds_and_never_takes_away(provider):
    olivia = User.objects.create_user("olivia")
    _grant("olivia", "supervisor", "orders")
    _grant("olivia", "viewer", "orders")
    _grant("olivia", "viewer", "orders")
    assert _held(olivia, provider) == ALL


def test_a_grant_is_audited_with_who_what_and_where(provider):
    User.objects.create_user("victor")
    _grant("victor", "viewer", "orders")
    event = AuditEvent.objects.get(kind="permission_granted")
    assert event.actor == COMMAND_LINE
    assert event.operation_key == ""  # the system chain
    assert event.data == {
        "user": "victor",
        "role": "viewer",
        "provider": "orders",
        "provider_id": provider.pk,
        "permissions": ["view_operations"],
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nobody", "viewer", "orders"), "no user named 'nobody'"),
        (("olivia", "viewer", "nowhere"), "no provider named 'nowhere'"),
        (("olivia", "admin", "orders"), "invalid choice: 'admin'"),
    ],
)
def test_grant_refuses_what_does_not_exist_and_grants_nothing(provider, args, message):
    User.objects.create_user("olivia")
    with pytest.raises(CommandError, match=message):
        _grant(*args)
    assert not AuditEvent.objects.filter(kind="permission_granted").exists()
    assert _held(User.objects.get(username="olivia"), provider) == set()


def test_grant_restores_a_role_group_that_was_changed(provider):
    Group.objects.filter(name="viewer").delete()
    Group.objects.get(name="operator").permissions.clear()
    User.objects.create_user("olivia")
    _grant("olivia", "viewer", "orders")
    assert Group.objects.get(name="viewer").permissions.count() == 1
    assert Group.objects.get(name="operator").permissions.count() == len(OPERATOR)
