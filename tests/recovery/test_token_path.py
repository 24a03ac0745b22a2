"""A host-API request signed with a token runs through the few middleware it needs, no more.

Every middleware above ``recovery.middleware.TokenRequestMiddleware`` runs for every
request: one added there costs each host-API call, so it must be named in ``ALLOWED``
here, on purpose. The statements each call may issue are held by
``test_statement_budget.py``.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from importlib import import_module
from typing import Any
from unittest import mock

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import DisallowedHost
from django.http import HttpResponse
from django.test import Client, RequestFactory
from django.urls import get_resolver
from guardian.shortcuts import assign_perm

from harness.providers import digest_of
from recovery.middleware import SKIPPED, TokenRequestMiddleware
from recovery.permissions import ProviderPermission
from tests.support.flow import PARAMS

pytestmark = pytest.mark.django_db

# What a token's request goes through: its id for the logs, the API's metrics, the
# security headers, and the shortcut itself.
ALLOWED = {
    "settle.logs.RequestIdMiddleware",
    "settle.metrics.HostApiMetricsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "recovery.middleware.TokenRequestMiddleware",
}


@pytest.fixture
def ran() -> Iterator[list[str]]:
    """The dotted names of the middleware each request went through, in order."""
    seen: list[str] = []
    patches = []
    for dotted in settings.MIDDLEWARE:
        module, _, name = dotted.rpartition(".")
        made = getattr(import_module(module), name)
        if inspect.isclass(made):

            def recording(self: Any, request: Any, _call: Any = made.__call__, _name: str = dotted):
                seen.append(_name)
                return _call(self, request)

            patches.append(mock.patch.object(made, "__call__", recording))
        else:  # a factory (allauth's): wrap what it makes, when the handler makes it

            def factory(get_response: Any, _make: Any = made, _name: str = dotted) -> Any:
                inner = _make(get_response)

                def middleware(request: Any) -> Any:
                    seen.append(_name)
                    return inner(request)

                return middleware

            patches.append(mock.patch.object(import_module(module), name, factory))
    for patch in patches:
        patch.start()
    yield seen
    for patch in reversed(patches):
        patch.stop()


def test_every_middleware_is_either_allowed_or_skipped_for_a_token():
    assert set(settings.MIDDLEWARE) == ALLOWED | set(SKIPPED)


def test_the_lifecycle_with_tokens_runs_through_the_allowed_middleware_only(
    flow, host_api, approver_api, ran
):
    calls = [
        lambda: flow.register(),
        lambda: host_api.post("/api/v1/operations/op-1/approvals"),
    ]
    for call in calls:
        ran.clear()
        call()
        assert set(ran) <= ALLOWED, ran
    approval = host_api.post("/api/v1/operations/op-1/approvals").json()["approval_id"]
    ran.clear()
    decided = approver_api.post(
        f"/api/v1/approvals/{approval}/decision",
        {"decision": "approve", "ttl_seconds": 300, "params_digest": digest_of(PARAMS)},
    )
    assert decided.status_code == 200, decided.content
    assert set(ran) <= ALLOWED, ran
    ran.clear()
    token = flow.dispatch().json()["fencing_token"]
    assert set(ran) <= ALLOWED, ran
    ran.clear()
    reported = host_api.post(
        "/api/v1/operations/op-1/result",
        {"fencing_token": token, "outcome": "committed", "provider_reference": "r-1"},
    )
    assert reported.status_code == 200, reported.content
    assert set(ran) <= ALLOWED, ran
    assert "recovery.middleware.TokenRequestMiddleware" in ran


def test_a_refused_token_is_answered_without_the_session_middleware(host_api, ran):
    response = Client().post(
        "/api/v1/operations",
        data="{}",
        content_type="application/json",
        HTTP_AUTHORIZATION="Bearer sth_not-a-token",
    )
    assert response.status_code == 401
    assert set(ran) <= ALLOWED, ran


def test_a_console_session_on_the_api_keeps_the_whole_stack(flow, provider, ran):
    user = get_user_model().objects.create_user(username="sup", password="unused-pw")
    assign_perm(ProviderPermission.DECIDE_APPROVALS.perm, user, provider)
    flow.register()
    approval = flow.host_api.post("/api/v1/operations/op-1/approvals").json()
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user)
    browser.get("/")
    ran.clear()
    response = browser.post(
        f"/api/v1/approvals/{approval['approval_id']}/decision",
        data={"decision": "approve", "ttl_seconds": 60, "params_digest": digest_of(PARAMS)},
        content_type="application/json",
        HTTP_X_CSRFTOKEN=browser.cookies["csrftoken"].value,
    )
    assert response.status_code == 200, response.content
    assert ran == list(settings.MIDDLEWARE)


def test_a_token_answer_says_its_length_as_the_whole_stack_would(host_api, provider):
    response = host_api.get("/api/v1/operations/nothing-here")
    assert response.status_code == 404
    assert response["Content-Length"] == str(len(response.content))


def test_a_token_request_to_a_host_not_allowed_is_refused_as_before():
    # The middleware alone: Django answers DisallowedHost with a 400 outside the API's
    # contract, which the suite's client would take for a violation.
    request = RequestFactory().get(
        "/api/v1/operations/nothing-here",
        HTTP_AUTHORIZATION="Bearer sth_x",
        HTTP_HOST="evil.example",
    )
    with pytest.raises(DisallowedHost):
        TokenRequestMiddleware(lambda request: HttpResponse())(request)


def test_the_api_is_the_first_pattern_a_request_is_resolved_against() -> None:
    """The resolver tries the patterns in order: the console's before the API's would be
    tried on every host-API request."""
    first = get_resolver().url_patterns[0]
    for path in ("api/v1/operations", "api/v1/operations/k-1/dispatch", "api/v1/approvals/a"):
        assert first.resolve(path) is not None, path
