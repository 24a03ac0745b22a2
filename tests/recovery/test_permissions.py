"""The permission vocabulary is defined once: the enum, the model's Meta and the database agree."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission

from recovery.models import Provider
from recovery.permissions import ProviderPermission
from recovery.services.roles import ROLES


def test_the_enum_is_the_providers_meta_permissions_in_order():
    # The migrations recorded this list; a different one would need a new migration.
    assert Provider._meta.permissions == [
        ("view_operations", "May view this provider's operations"),
        ("lookup_operations", "May look up evidence for this provider's operations"),
        ("confirm_operations", "May confirm this provider's operations"),
        ("repair_operations", "May repair stranded receipts of this provider"),
        ("void_operations", "May void this provider's operations"),
        ("propose_reconciliations", "May propose a reconciliation for four-eyes approval"),
        ("approve_reconciliations", "May approve another operator's reconciliation"),
        ("decide_approvals", "May approve or deny this provider's actions"),
    ]
    assert [codename for codename, _ in Provider._meta.permissions] == list(ProviderPermission)


@pytest.mark.django_db
def test_every_member_is_a_permission_in_the_database():
    stored = set(
        Permission.objects.filter(
            content_type__app_label="recovery", content_type__model="provider"
        ).values_list("codename", flat=True)
    )
    assert set(ProviderPermission) <= stored
    assert ProviderPermission.DECIDE_APPROVALS.perm == "recovery.decide_approvals"


def test_roles_are_made_of_members_and_the_supervisor_holds_every_one():
    assert all(isinstance(p, ProviderPermission) for role in ROLES.values() for p in role)
    assert set(ROLES["supervisor"]) == set(ProviderPermission)
    assert set(ROLES["viewer"]) == {ProviderPermission.VIEW_OPERATIONS}
