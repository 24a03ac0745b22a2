"""How fast a customer's approval goes (``manage.py benchmark_customer``).

    python manage.py benchmark_customer [--approvals N] [--pages P]

Figures, not a test; a development tool. A scratch database (as ``benchmark_recovery``'s),
a real gunicorn serving the host API and the customer page, one real Celery worker on the
webhook queue, and a webhook receiver in this process (a threaded ``http.server`` on
127.0.0.1).

page
    The customer page's server time: ``POST /approve/state`` (what the link's script asks
    first) and ``GET /approve/``, P times each, through Django's WSGI handler in this
    process (no network), p50 and p95.
tap to webhook
    N customer approvals opened through gunicorn; for each, the page's decision POST to
    gunicorn (the customer's tap) is the start, the ``approval.decided`` webhook arriving
    at the receiver the end: p50, p95, max.
statements
    SQL statements of one opening (``POST …/approvals``) with a party and its link, and of
    one without (a ``person`` rule), BEGIN and COMMIT included.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import redis
from celery import current_app as celery_app
from django.conf import settings
from django.core.management.base import CommandError
from django.db import connection, connections
from django.test import Client
from django.test.utils import CaptureQueriesContext

from bench.recovery import BENCH, RecoveryBenchmark, _percentile, celery_start, celery_stop
from common.links import approval_link_token
from harness.gunicorn import gunicorn_start, gunicorn_stop
from policies.services import policy_apply
from recovery.models import Provider
from recovery.services.credentials import host_create
from webhooks.endpoints import webhook_endpoint_add

POLICY = b"""
[[rules]]
name = "customer"
provider = "bench-customer"
when = ['/currency == "EUR"']
outcome = "customer"
expires_after = "1h"

[[rules]]
name = "staff"
outcome = "person"

[[actions]]
action = "payment.send"
summary = "Pay {/amount:money:/currency} to {/to}"
"""
PARAMS = {"amount": 1250, "currency": "EUR", "to": "acct-7"}
PARTY = {"id": "cust_8812", "name": "Ada Lovelace"}
TRIES = 1_000_000
_CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


class _Receiver:
    """When each approval's ``approval.decided`` arrived (``time.monotonic``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.decided: dict[str, float] = {}
        self.opened: dict[str, float] = {}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                arrivals = {
                    "approval.decided": receiver.decided,
                    "approval.opened": receiver.opened,
                }
                if body["type"] in arrivals:
                    with receiver.lock:
                        arrivals[body["type"]].setdefault(
                            body["data"]["approval_id"], time.monotonic()
                        )
                self.send_response(204)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _figures(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "p50_ms": round(_percentile(ordered, 0.5) * 1000, 1),
        "p95_ms": round(_percentile(ordered, 0.95) * 1000, 1),
        "max_ms": round(ordered[-1] * 1000, 1),
    }


class CustomerBenchmark(RecoveryBenchmark):
    scratch_suffix = "_benchcust"

    def run(self, **options: Any) -> None:
        scratch = Path(tempfile.mkdtemp(prefix="settle-benchcust-"))
        database_url = self._scratch_database(scratch)
        broker = os.environ.get("CELERY_BROKER_URL", "")
        if not broker.startswith("redis://"):
            raise CommandError("benchmark_customer needs CELERY_BROKER_URL=redis://…")
        queue = f"settle-benchcust-{uuid.uuid4().hex[:8]}"
        celery_app.conf.broker_url = broker
        settings.CELERY_TASK_DEFAULT_QUEUE = queue
        settings.SETTLE_WEBHOOK_QUEUE = f"{queue}-webhooks"
        settings.SETTLE_WEBHOOKS_ALLOW_PRIVATE = True
        # One address makes every try here: the per-address limit would measure itself.
        settings.SETTLE_LINK_TRIES_PER_MINUTE = TRIES
        receiver = _Receiver()
        procs: list[subprocess.Popen[bytes]] = []
        server = None
        try:
            token = self._setup(receiver)
            statements = self._statements(token)
            page = self._page(token, options["pages"])
            env = {
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "settle.settings",
                "DATABASE_URL": database_url,
                "CELERY_BROKER_URL": broker,
                "SETTLE_CELERY_QUEUE": queue,
                "SETTLE_WEBHOOK_QUEUE": f"{queue}-webhooks",
                "SETTLE_WEBHOOKS_ALLOW_PRIVATE": "true",
                "SETTLE_WEBHOOK_SECONDS": "1",
                "SETTLE_LINK_TRIES_PER_MINUTE": str(TRIES),
                "SETTLE_AUDIT_CHECKPOINT_FILE": str(scratch / "checkpoints.jsonl"),
            }
            log = scratch / "worker.log"
            procs = [
                celery_start("worker", name="cust", log=log, env=env, queues=f"{queue}-webhooks")
            ]
            self._workers_ready(procs, [log])
            server = gunicorn_start(
                database_url=database_url,
                log_path=scratch / "gunicorn.log",
                workers=2,
                env={key: env[key] for key in env if key.startswith(("SETTLE_", "CELERY_"))},
            )
            self.stdout.write(
                f"database {connection.vendor}, broker {broker}, gunicorn 2 workers, 1 Celery "
                f"worker, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
            )
            taps = self._taps(server.url, token, receiver, options["approvals"])
            self.stdout.write(f"statements of an opening: {json.dumps(statements)}")
            self.stdout.write(f"customer page, server time: {json.dumps(page)}")
            self.stdout.write(f"tap to approval.decided webhook: {json.dumps(taps)}")
        finally:
            if server is not None:
                gunicorn_stop(server)
            celery_stop(procs)
            receiver.stop()
            connections.close_all()
            owner = redis.Redis.from_url(broker)
            for name in (queue, f"{queue}-webhooks"):
                owner.delete(name, f"_kombu.binding.{name}", f"_kombu.binding_permanent.{name}")
            owner.close()
            if not options["keep"]:
                shutil.rmtree(scratch, ignore_errors=True)

    def _setup(self, receiver: _Receiver) -> str:
        host, token = host_create(name="bench-customer", display_name="Acme Payments")
        Provider.objects.create(name="bench-customer", adapter="journal", path="/dev/null")
        policy_apply(source=POLICY, actor=BENCH)
        webhook_endpoint_add(host_name=host.name, url=receiver.url, actor=BENCH)
        return token

    def _register(self, client: Any, token: str, key: str, params: dict[str, Any]) -> None:
        body = {
            "key": key,
            "action": "payment.send",
            "provider": "bench-customer",
            "params": params,
        }
        answer = client.post(
            "/api/v1/operations",
            content=json.dumps(body),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        assert answer.status_code == 201, answer.text

    def _statements(self, token: str) -> dict[str, int]:
        client = Client(HTTP_HOST="127.0.0.1")
        auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
        counts = {}
        for name, params, body in (
            ("without_party", {**PARAMS, "currency": "USD"}, {}),
            ("with_party_and_link", PARAMS, {"party": PARTY}),
        ):
            for key in (f"warm-{name}", f"count-{name}"):
                client.post(
                    "/api/v1/operations",
                    json.dumps(
                        {
                            "key": key,
                            "action": "payment.send",
                            "provider": "bench-customer",
                            "params": params,
                        }
                    ),
                    content_type="application/json",
                    **auth,
                )
                with CaptureQueriesContext(connection) as queries:
                    answer = client.post(
                        f"/api/v1/operations/{key}/approvals",
                        json.dumps(body),
                        content_type="application/json",
                        **auth,
                    )
                assert answer.status_code == 201, answer.content
            counts[name] = len(queries.captured_queries)
        counts["more"] = counts["with_party_and_link"] - counts["without_party"]
        return counts

    def _page(self, token: str, pages: int) -> dict[str, Any]:
        client = Client(HTTP_HOST="127.0.0.1")
        auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
        client.post(
            "/api/v1/operations",
            json.dumps(
                {
                    "key": "page-1",
                    "action": "payment.send",
                    "provider": "bench-customer",
                    "params": PARAMS,
                }
            ),
            content_type="application/json",
            **auth,
        )
        opened = client.post(
            "/api/v1/operations/page-1/approvals",
            json.dumps({"party": PARTY}),
            content_type="application/json",
            **auth,
        ).json()
        link = approval_link_token(opened["approval_id"])
        browser = Client(HTTP_HOST="127.0.0.1")
        state, shell = [], []
        for _ in range(pages):
            began = time.perf_counter()
            assert browser.get("/approve/").status_code == 200
            shell.append(time.perf_counter() - began)
            began = time.perf_counter()
            assert browser.post("/approve/state", {"token": link}).status_code == 200
            state.append(time.perf_counter() - began)
        return {"state": _figures(state), "page": _figures(shell)}

    def _taps(self, url: str, token: str, receiver: _Receiver, count: int) -> dict[str, Any]:
        latencies = []
        with httpx.Client(base_url=url, timeout=10.0, trust_env=False) as host:
            for n in range(count):
                key = f"tap-{n}"
                self._register(host, token, key, PARAMS)
                opened = host.post(
                    f"/api/v1/operations/{key}/approvals",
                    content=json.dumps({"party": PARTY}),
                    headers={
                        "Authorization": f"Bearer {token}",
                        "Content-Type": "application/json",
                    },
                ).json()
                # The customer taps once the host has the link (its approval.opened arrived).
                self._arrived(receiver.opened, opened["approval_id"], time.monotonic() + 30)
                with httpx.Client(base_url=url, timeout=10.0, trust_env=False) as phone:
                    page = phone.get("/approve/")
                    csrf = _CSRF.search(page.text)
                    assert csrf is not None
                    link = approval_link_token(opened["approval_id"])
                    state = phone.post(
                        "/approve/state",
                        data={"token": link},
                        headers={"X-CSRFToken": csrf.group(1)},
                    )
                    digest = re.search(r'name="params_digest" value="([^"]+)"', state.text)
                    assert digest is not None, (state.status_code, state.text[:300])
                    tapped = time.monotonic()
                    decided = phone.post(
                        "/approve/decide",
                        data={
                            "token": link,
                            "decision": "approve",
                            "params_digest": digest.group(1),
                        },
                        headers={"X-CSRFToken": csrf.group(1)},
                    )
                    assert decided.status_code == 200, decided.text
                arrived = self._arrived(receiver.decided, opened["approval_id"], tapped + 30)
                latencies.append(arrived - tapped)
        return _figures(latencies)

    def _arrived(self, arrivals: dict[str, float], approval_id: str, deadline: float) -> float:
        while approval_id not in arrivals and time.monotonic() < deadline:
            time.sleep(0.002)
        if approval_id not in arrivals:
            raise CommandError(f"no webhook for approval {approval_id} within 30 s")
        return arrivals[approval_id]
