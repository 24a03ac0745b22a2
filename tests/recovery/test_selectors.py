"""Selectors start from the caller and return only what it may see."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from guardian.shortcuts import assign_perm

from approvals.models import Approver
from approvals.services.approvals import Binding, approval_request
from common.actors import Actor
from recovery.models import Provider
from recovery.permissions import ProviderPermission
from recovery.selectors.access import (
    approval_for_caller,
    approvals_for_approver,
    approvals_for_user,
)
from recovery.services.errors import RecoveryError
from recovery.services.providers import provider_configure

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_providers(provider: Provider) -> tuple[Provider, Provider]:
    other, _ = provider_configure(name="ledger", adapter="sqlite", path=provider.path)
    for name, host in (("orders", "shop"), ("ledger", "shop"), ("orders", "till")):
        binding = Binding(
            operation_key=f"{name}-{host}",
            action="payment.send",
            provider=name,
            params_digest="sha256:" + "0" * 64,
        )
        approval_request(binding=binding, requested_by=Actor("host", "1", host), host=host)
    return provider, other


def keys(approvals) -> set[str]:
    return {approval.operation_key for approval in approvals}


def test_an_approver_sees_its_providers_and_hosts_only(two_providers):
    everything = Approver(name="desk", all_providers=True)
    orders = Approver(name="phone", providers=["orders"])
    orders_at_shop = Approver(name="shop-phone", providers=["orders"], hosts=["shop"])
    assert keys(approvals_for_approver(approver=everything)) == {
        "orders-shop",
        "ledger-shop",
        "orders-till",
    }
    assert keys(approvals_for_approver(approver=orders)) == {"orders-shop", "orders-till"}
    assert keys(approvals_for_approver(approver=orders_at_shop)) == {"orders-shop"}


def test_a_console_user_sees_the_providers_granted_to_them(two_providers):
    _, ledger = two_providers
    user = get_user_model().objects.create_user(username="olivia")
    assert keys(approvals_for_user(user=user)) == set()
    assign_perm(ProviderPermission.VIEW_OPERATIONS.perm, user, ledger)
    assert keys(approvals_for_user(user=user)) == {"ledger-shop"}
    # A model-wide permission grants nothing here: roles are granted per provider.
    user.user_permissions.add(Permission.objects.get(codename=ProviderPermission.DECIDE_APPROVALS))
    user = get_user_model().objects.get(pk=user.pk)  # permissions are cached per object
    assert keys(approvals_for_user(user=user)) == {"ledger-shop"}
    superuser = get_user_model().objects.create_superuser(username="root")
    assert keys(approvals_for_user(user=superuser)) == {
        "orders-shop",
        "ledger-shop",
        "orders-till",
    }


def test_an_approval_a_user_may_view_or_decide_exists_for_them_to_read(two_providers):
    """Reading only: who may decide is the service's rule (``test_service_access``)."""
    orders, ledger = two_providers
    user = get_user_model().objects.create_user(username="victor")
    assign_perm(ProviderPermission.VIEW_OPERATIONS.perm, user, orders)
    assign_perm(ProviderPermission.DECIDE_APPROVALS.perm, user, ledger)
    visible = {a.operation_key: a.pk for a in approvals_for_user(user=user)}
    assert set(visible) == {"orders-shop", "orders-till", "ledger-shop"}
    read = approval_for_caller(approval_id=visible["ledger-shop"], user=user)
    assert read.provider == "ledger"
    stranger = get_user_model().objects.create_user(username="oscar")
    with pytest.raises(RecoveryError) as refused:
        approval_for_caller(approval_id=visible["ledger-shop"], user=stranger)
    assert refused.value.code == "unknown_approval"
