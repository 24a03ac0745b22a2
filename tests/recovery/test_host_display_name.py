"""A host's display name: who asks, on its customers' approval pages."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from recovery.models import Host


def test_create_host_takes_a_display_name(db):
    call_command("create_host", "fleet-x", "--display-name", "Acme Payments", stdout=io.StringIO())
    host = Host.objects.get(name="fleet-x")
    assert host.display_name == "Acme Payments" and host.shown_name == "Acme Payments"
    with pytest.raises(CommandError):
        call_command("create_host", "fleet-y", "--display-name", "x" * 201, stdout=io.StringIO())


def test_without_one_the_name_is_shown(db):
    call_command("create_host", "fleet-z", stdout=io.StringIO())
    assert Host.objects.get(name="fleet-z").shown_name == "fleet-z"


def test_the_admin_makes_a_host_with_its_display_name(db):
    admin = User.objects.create_superuser("root", password="pw-long-enough-123")
    client = Client()
    client.force_login(admin)
    response = client.post(
        "/admin/recovery/host/add/", {"name": "fleet-a", "display_name": "Acme Payments"}
    )
    assert response.status_code == 302, response.content[:500]
    assert Host.objects.get(name="fleet-a").display_name == "Acme Payments"
