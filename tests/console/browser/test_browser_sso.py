"""Single sign-on in Chromium: the console's button, the directory's own sign-in page (the
tests' OpenID Connect provider, a process of its own), and back; the groups changed at the
provider change the roles at the next sign-in, and a group removed loses access."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from harness.accounts import PASSWORD
from harness.oidc import IdentityProvider
from harness.sso import sso_on
from recovery.models import Provider
from recovery.permissions import ProviderPermission as P
from tests.support.browser import screenshots_everywhere

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def _directory_sign_in(page: Page, idp: IdentityProvider, username: str) -> None:
    """Press the console's button; at the provider's own page, sign in as ``username``."""
    page.goto("/login/")
    page.click('[data-sso="sso"]')
    page.wait_for_url(f"{idp.url}/**")
    page.fill('input[name="login"]', username)
    page.fill('input[name="password"]', PASSWORD)
    page.click('button[type="submit"]')


def _roles(provider: Provider) -> set[str]:
    user = User.objects.get(socialaccount__provider="sso")
    return {p for p in (P.VIEW_OPERATIONS, P.VOID_OPERATIONS) if user.has_perm(p.perm, provider)}


def test_chromium_signs_in_through_the_directory_and_follows_its_groups(
    page: Page, live_server: Any, settings: Any, idp: IdentityProvider, tmp_path: Path, provider
) -> None:
    sso_on(
        settings,
        idp,
        tmp_path,
        allowed_groups=("settle-operators", "settle-viewers"),
        base=live_server.url,
    )
    idp.directory.person("ada", groups=["settle-operators"])
    page.goto("/login/")
    screenshots_everywhere(page, "sign-in-sso")

    _directory_sign_in(page, idp, "ada")
    page.wait_for_url(f"{live_server.url}/")
    expect(page.locator(".who")).to_have_text("ada")
    assert _roles(provider) == {P.VIEW_OPERATIONS, P.VOID_OPERATIONS}

    # Demoted at the provider: the next sign-in (the provider remembers Ada) demotes here.
    page.click("text=Sign out")
    idp.directory.groups("ada", ["settle-viewers"])
    page.goto("/login/")
    page.click('[data-sso="sso"]')
    page.wait_for_url(f"{live_server.url}/")
    assert _roles(provider) == {P.VIEW_OPERATIONS}

    # Out of every allowed group: refused, with nothing left to act with.
    page.click("text=Sign out")
    idp.directory.groups("ada", ["marketing"])
    page.goto("/login/")
    page.click('[data-sso="sso"]')
    refusal = page.locator("[data-refusal]")
    expect(refusal).to_have_attribute("data-refusal", "sso_group_not_allowed")
    screenshots_everywhere(page, "sign-in-refused")
    assert _roles(provider) == set()
    page.goto("/")
    expect(page).to_have_url(f"{live_server.url}/login/?next=/")
