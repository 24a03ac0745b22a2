"""A lockout attempt from one address through gunicorn behind the proxy: the owner, signing
in from another address, still gets in.

Everything is real: gunicorn started as production runs it, with SETTLE_BEHIND_PROXY=true,
and PostgreSQL. The requests carry the ``X-Forwarded-For`` the proxy would have written.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from django.db import connection

from harness.accounts import PASSWORD
from harness.gunicorn import database_url, gunicorn_running
from tests.support.console import console_user

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

_CSRF = re.compile(rb'name="csrfmiddlewaretoken" value="([^"]+)"')


def _sign_in(base: str, username: str, password: str, address: str) -> int:
    """One sign-in as a browser behind the proxy at ``address`` makes it: the status."""
    headers = {"X-Forwarded-For": address}
    with httpx.Client(base_url=base, headers=headers, timeout=10.0, trust_env=False) as client:
        page = client.get("/login/")
        assert page.status_code == 200, page.text[:500]
        token = _CSRF.search(page.content)
        assert token is not None
        answer = client.post(
            "/login/",
            data={
                "login": username,
                "password": password,
                "csrfmiddlewaretoken": token.group(1).decode(),
            },
        )
        return answer.status_code


def test_wrong_passwords_from_one_address_do_not_lock_the_owner_out_elsewhere(
    tmp_path: Path,
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("gunicorn's workers share the PostgreSQL test database")
    console_user("sam")
    with gunicorn_running(
        database_url=database_url(connection.settings_dict),
        log_path=tmp_path / "gunicorn.log",
        workers=1,
        env={"SETTLE_BEHIND_PROXY": "true"},
    ) as server:
        attacker = [_sign_in(server.url, "sam", "wrong", "203.0.113.7") for _ in range(6)]
        assert attacker[:4] == [200] * 4 and attacker[-1] == 429, attacker
        assert _sign_in(server.url, "sam", PASSWORD, "198.51.100.9") == 302, server.log_tail()
        # The attacker's own address stays locked for that account.
        assert _sign_in(server.url, "sam", PASSWORD, "203.0.113.7") == 429
