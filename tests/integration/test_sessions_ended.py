"""A supervisor ends a person's sessions: two browsers of one person against gunicorn,
signed in each on its own, are both sent to sign in at their next request.

Real processes: gunicorn as production runs it, on PostgreSQL; the sessions are the
database's rows, found through allauth.usersessions' rows written at sign-in.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from django.db import connection

from harness.accounts import PASSWORD
from harness.gunicorn import database_url, gunicorn_running
from recovery.models import Provider
from tests.support.console import console_user

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

_CSRF = re.compile(rb'name="csrfmiddlewaretoken" value="([^"]+)"')


def _token(page: httpx.Response) -> str:
    found = _CSRF.search(page.content)
    assert found is not None, page.text[:500]
    return found.group(1).decode()


def _browser(base: str, username: str) -> httpx.Client:
    """A browser of its own (its own cookies), signed in as ``username``."""
    client = httpx.Client(base_url=base, timeout=10.0, trust_env=False)
    page = client.get("/login/")
    answer = client.post(
        "/login/",
        data={"login": username, "password": PASSWORD, "csrfmiddlewaretoken": _token(page)},
    )
    assert answer.status_code == 302, answer.text[:500]
    assert client.get("/").status_code == 200
    return client


def test_a_supervisor_ends_both_sessions_of_a_person(tmp_path: Path, provider: Provider) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("gunicorn's workers share the PostgreSQL test database")
    olivia = console_user("olivia", "operator", provider)
    console_user("sam", "supervisor", provider)
    with gunicorn_running(
        database_url=database_url(connection.settings_dict),
        log_path=tmp_path / "gunicorn.log",
        workers=2,
    ) as server:
        laptop, phone = _browser(server.url, "olivia"), _browser(server.url, "olivia")
        sam = _browser(server.url, "sam")
        people = sam.get("/people/")
        assert people.status_code == 200
        ended = sam.post(
            f"/people/{olivia.pk}/end-sessions", data={"csrfmiddlewaretoken": _token(people)}
        )
        assert (ended.status_code, ended.headers["location"]) == (302, "/people/")
        for client in (laptop, phone):
            gone = client.get("/")
            assert (gone.status_code, gone.headers["location"]) == (302, "/login/?next=/")
        assert sam.get("/").status_code == 200, server.log_tail()
        for client in (laptop, phone, sam):
            client.close()
