"""The people page in a real browser: a superuser ends a person's sessions."""

from __future__ import annotations

import pytest
from allauth.mfa.models import Authenticator
from allauth.socialaccount.models import SocialAccount
from django.contrib.auth.models import User
from django.test import Client
from playwright.sync_api import Page, expect

from harness.accounts import PASSWORD
from tests.support.browser import screenshots_everywhere, sign_in
from tests.support.console import console_user

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def people(provider, other_provider, operator, viewer):
    User.objects.create_superuser("root", "root@example.com", PASSWORD)
    console_user("sam", "supervisor", provider)
    console_user("oscar", "operator", other_provider)
    gone = console_user("gina", "viewer", provider)
    gone.is_active = False
    gone.save()
    for _ in range(2):
        Client().post("/login/", {"login": "olivia", "password": PASSWORD})
    SocialAccount.objects.create(user=viewer, provider="sso", uid="sub-victor")
    Authenticator.objects.create(user=viewer, type=Authenticator.Type.WEBAUTHN, data={})


def test_a_superuser_ends_a_persons_sessions(page: Page, people):
    sign_in(page, "root")
    page.get_by_role("link", name="People").click()
    expect(page.locator("h1")).to_have_text("People")
    olivia = page.locator('tr[data-person="olivia"]')
    expect(olivia.locator("[data-sessions]")).to_have_text("2")
    screenshots_everywhere(page, "people")
    olivia.get_by_role("button", name="End sessions").click()
    expect(page.locator(".notice")).to_have_text("Ended 2 sessions of olivia.")
    expect(olivia.locator("[data-sessions]")).to_have_text("0")
    expect(olivia.get_by_role("button", name="End sessions")).to_have_count(0)
    screenshots_everywhere(page, "people-ended")
