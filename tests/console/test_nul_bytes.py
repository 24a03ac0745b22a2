"""A NUL byte in a URL or a query parameter is a 404 (or the API's 400), never a 500.

PostgreSQL refuses a NUL inside any text it is sent, so a view that passes one to a query
fails there; SQLite takes it and finds nothing.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from tests.support.console import console_user
from tests.support.flow import Api

pytestmark = pytest.mark.django_db

NUL = "a%00b"

CONSOLE_PAGES = [
    f"/operations/{NUL}/",
    f"/?q={NUL}",
    f"/?q={NUL}&jump=1",
    f"/?provider={NUL}",
    f"/?after={NUL}",
    f"/audit/?q={NUL}",
    f"/audit/?provider={NUL}",
    f"/audit/?key={NUL}",
    f"/audit/?after={NUL}",
    f"/dashboard/?provider={NUL}",
    f"/bulk/preview?provider={NUL}",
    f"/bulk/preview?q={NUL}",
    f"/batches/?provider={NUL}",
    f"/reconciliations/?provider={NUL}",
    f"/webhooks/?host={NUL}",
    f"/status/?provider={NUL}",
    f"/admin/recovery/operation/?q={NUL}",
    f"/admin/recovery/operation/{NUL}/change/",
    f"/admin/audit/auditevent/?q={NUL}",
    f"/admin/auth/user/?q={NUL}",
]
# An export refuses a filter it cannot apply rather than hand out more than was asked.
EXPORTS = [f"/audit/export.csv?key={NUL}", f"/audit/export.jsonl?provider={NUL}"]
CONSOLE_ACTIONS = [
    f"/operations/{NUL}/lookup",
    f"/operations/{NUL}/claim",
    f"/operations/{NUL}/release",
    f"/operations/{NUL}/void",
]
API_PATHS = [
    ("get", f"/api/v1/operations/{NUL}"),
    ("get", f"/api/v1/approvals/{NUL}"),
    ("post", f"/api/v1/operations/{NUL}/dispatch"),
    ("post", f"/api/v1/operations/{NUL}/resume"),
    ("post", f"/api/v1/operations/{NUL}/heartbeat"),
    ("post", f"/api/v1/operations/{NUL}/result"),
    ("post", f"/api/v1/approvals/{NUL}/decision"),
    ("post", f"/api/v1/permits/{NUL}/revoke"),
    ("post", f"/api/v1/providers/{NUL}/callbacks"),
]


@pytest.fixture
def signed_in(provider: object) -> Client:
    user: User = console_user("sam", "supervisor", provider)  # type: ignore[arg-type]
    user.is_superuser = True
    user.save()
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def test_a_nul_byte_in_a_console_url_is_never_a_server_error(signed_in: Client):
    answers = {path: signed_in.get(path).status_code for path in CONSOLE_PAGES}
    answers.update(
        {path: signed_in.post(path, {"reason": "x"}).status_code for path in CONSOLE_ACTIONS}
    )
    wrong = {path: status for path, status in answers.items() if status not in {200, 302, 404}}
    assert wrong == {}
    # An operation URL names no operation; an action on one is not found either.
    assert answers[f"/operations/{NUL}/"] == 404
    assert all(answers[path] == 404 for path in CONSOLE_ACTIONS)
    for path in EXPORTS:
        response = signed_in.get(path)
        assert response.status_code == 400
        assert response.content.startswith(b"invalid_filter: ")


def test_a_nul_byte_in_an_api_url_is_a_client_error(host_api: Api):
    host_api.client.raise_request_exception = False
    for method, path in API_PATHS:
        response = host_api.get(path) if method == "get" else host_api.post(path, {})
        assert response.status_code in {400, 401, 403, 404}, (path, response.content[:300])


def test_a_link_to_a_chain_no_key_names_still_renders(signed_in: Client):
    # A tampered audit row may name any chain; the trail still links it (to a 404).
    assert reverse("operation", args=["not a key"]) == "/operations/not%20a%20key/"
    assert signed_in.get("/operations/not%20a%20key/").status_code == 404
