"""How long a single sign-on takes Settle itself (``manage.py benchmark_sso``).

    python manage.py benchmark_sso [--sign-ins 30]

Figures, not a test. Starts the tests' own OpenID Connect provider (``harness.oidc``,
a process of its own on loopback), points Settle at it in a scratch database, and signs
one person in ``--sign-ins`` times (signing out after each) through Django's test
client: Settle's button (the authorization request), the person at the provider (not
Settle's time), Settle's callback (discovery, token, userinfo, the ID token's checks,
roles synced, the sign-in recorded). Settle's own time is the time in those two requests
less what Settle waited on the provider: every request Settle sent it, timed where
requests sends it.

It also counts the statements of the queue page for that person once signed in, beside
those for a local account with the same roles signed in by password: the roles are
synced at sign-in, never on a page. The last line is one JSON object.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management.base import OutputWrapper
from django.db import connection, connections
from django.test import Client

from bench.scratch import scratch_database_use
from bench.sqlcount import statements_noted
from common.actors import Actor
from harness.accounts import PASSWORD
from harness.oidc import identity_provider_start
from harness.sso import sso_on, sso_start
from recovery.models import Provider
from recovery.services.providers import provider_configure
from recovery.services.roles import role_grant, roles_ensure

BENCH = Actor.system("benchmark")
# The test client's requests name this host (one ALLOWED_HOSTS has, outside the tests).
SITE = "http://localhost"


def _client() -> Client:
    return Client(SERVER_NAME="localhost")


class _Waited:
    """The time this process spent in requests it sent (to the identity provider)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.requests = 0

    @contextmanager
    def counting(self) -> Iterator[None]:
        send = requests.Session.send

        def timed(session: requests.Session, request: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return send(session, request, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
                self.requests += 1

        requests.Session.send = timed  # type: ignore[method-assign]
        try:
            yield
        finally:
            requests.Session.send = send  # type: ignore[method-assign]


class SsoBenchmark:
    def __init__(self, stdout: OutputWrapper) -> None:
        self.stdout = stdout
        # One client for every sign-in, its cookies cleared between them: a client loads
        # the middleware at its first request (WhiteNoise reads the static files then),
        # which a server does once per process, not once per sign-in.
        self.client = _client()

    def run(self, *, sign_ins: int, **_: Any) -> None:
        scratch = Path(tempfile.mkdtemp(prefix="settle-benchsso-"))
        idp = identity_provider_start(scratch / "idp")
        try:
            scratch_database_use(scratch, "_benchsso")
            for name in ("orders", "ledger"):
                provider_configure(name=name, adapter="journal", path="/none.jsonl", actor=BENCH)
            sso_on(settings, idp, scratch, allowed_groups=("settle-operators",), base=SITE)
            idp.directory.person("ada", groups=["settle-operators"])
            samples = [self._sign_in(idp) for _ in range(sign_ins)]
            pages = self._pages(idp)
        finally:
            idp.stop()
            connections.close_all()
            shutil.rmtree(scratch, ignore_errors=True)
        first, rest = samples[0], samples[1:] or samples
        own = sorted(s["own_ms"] for s in rest)
        figures = {
            "database": connection.vendor,
            "sign_ins": sign_ins,
            "first_own_ms": first["own_ms"],
            "own_p50_ms": round(statistics.median(own), 1),
            "own_p95_ms": round(own[min(len(own) - 1, int(len(own) * 0.95))], 1),
            "own_max_ms": round(own[-1], 1),
            "provider_p50_ms": round(statistics.median(s["provider_ms"] for s in rest), 1),
            "provider_requests": rest[-1]["provider_requests"],
            "callback_statements": rest[-1]["statements"],
            **pages,
        }
        self.stdout.write(
            f"single sign-on, Settle's own time ({connection.vendor}): first (the account "
            f"made) {figures['first_own_ms']} ms; then p50 {figures['own_p50_ms']} ms, "
            f"p95 {figures['own_p95_ms']} ms, max {figures['own_max_ms']} ms, "
            f"{figures['callback_statements']} statements in the callback; the provider "
            f"answered {figures['provider_requests']} requests in {figures['provider_p50_ms']} "
            f"ms (p50)"
        )
        self.stdout.write(
            f"the queue page once signed in: {pages['queue_statements_sso']} statements by "
            f"single sign-on, {pages['queue_statements_password']} by password, same roles"
        )
        self.stdout.write(json.dumps(figures))

    def _sign_in(self, idp: Any) -> dict[str, Any]:
        client = self.client
        client.cookies.clear()
        waited = _Waited()
        with waited.counting():
            started = time.perf_counter()
            authorize = sso_start(client)
            button = time.perf_counter() - started
        back = urlsplit(idp.authorize(authorize, "ada"))  # the person, at the provider
        with waited.counting(), statements_noted() as statements:
            started = time.perf_counter()
            response = client.get(f"{back.path}?{back.query}")
            callback = time.perf_counter() - started
        assert response.status_code == 302 and response["Location"] == "/", response.content[:300]
        # Signed out again, as a person's sessions end: allauth reads each of a person's
        # open sessions at their every sign-in, so a thousand open ones would be measured.
        client.post("/logout/")
        total = button + callback
        return {
            "own_ms": round((total - waited.seconds) * 1000, 1),
            "provider_ms": round(waited.seconds * 1000, 1),
            "provider_requests": waited.requests,
            "statements": len(statements),
        }

    def _pages(self, idp: Any) -> dict[str, int]:
        sso = _client()
        back = urlsplit(idp.authorize(sso_start(sso), "ada"))
        sso.get(f"{back.path}?{back.query}")
        local = User.objects.create_user("olivia", password=PASSWORD)
        roles_ensure()
        for provider in Provider.objects.all():
            role_grant(user=local, role="operator", provider=provider, actor=BENCH)
        settings.SETTLE_SSO_ENABLED = False  # a password signs in a non-superuser again
        password = _client()
        assert (
            password.post("/login/", {"login": "olivia", "password": PASSWORD}).status_code == 302
        )
        counts = {}
        for name, client in (("sso", sso), ("password", password)):
            client.get("/")  # the first page after sign-in writes the session's activity
            with statements_noted() as statements:
                assert client.get("/").status_code == 200
            counts[f"queue_statements_{name}"] = len(statements)
        return counts
