"""How fast webhooks reach a receiver (``manage.py benchmark_webhooks``).

    python manage.py benchmark_webhooks [--events N] [--rate R] [--down-seconds S] [--hanging H]

Figures, not a test; a development tool. Everything happens in a scratch database (as
``benchmark_recovery``'s) with W real ``celery -A settle worker -Q <webhook queue>``
processes (deliveries have a queue of their own, as in production) and beat, delivering
to a receiver in this process (a threaded ``http.server`` on 127.0.0.1 that
verifies one signature in twenty with ``standardwebhooks``).

burst
    N outbox messages committed in transactions of 100 (as many changes committing at
    once), for 50 operations: deliveries per second from the first commit to the last
    message received.
steady
    R changes a second, one message per transaction, for 10 s: the time from each
    commit to its arrival at the receiver (p50, p95, max).
receiver down
    The receiver stops for S seconds while changes go on at 2 a second, then comes back
    (changes go on): every message must arrive; a duplicate may arrive only with the
    same ``webhook-id``, so ``lost`` counts ids never received.
hanging endpoint
    A second endpoint of the same host on a socket that accepts and never answers; H
    changes committed in transactions of 100, each a message to both endpoints: how fast
    the good receiver still gets its H (deliveries per second, first commit to last
    arrival), and how many requests the silent one accepted (each costs a delivery
    thread ``SETTLE_WEBHOOK_TIMEOUT_SECONDS``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import redis
from celery import current_app as celery_app
from django.conf import settings
from django.core.management.base import CommandError, OutputWrapper
from django.db import connections, transaction
from standardwebhooks import Webhook

from bench.recovery import RecoveryBenchmark, _percentile, celery_start, celery_stop
from common.actors import Actor
from recovery.models import Host, Operation, Provider, State
from webhooks.endpoints import webhook_endpoint_add, webhook_endpoint_disable
from webhooks.models import WebhookEvent, WebhookMessage
from webhooks.outbox import OutboxEvent, webhook_events_record

BENCH = Actor.system("benchmark")


class _Receiver:
    """Counts what arrives: each webhook-id's arrivals and the first one's latency."""

    def __init__(self, port: int = 0) -> None:
        self.lock = threading.Lock()
        self.arrivals: dict[str, int] = {}
        self.latencies: dict[str, float] = {}
        self.last_at = 0.0
        self.secret = ""
        self.bad_signatures = 0
        self.requests = 0
        self.server = self._serve(port)

    def _serve(self, port: int) -> ThreadingHTTPServer:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                now = time.time()
                msg_id = self.headers["webhook-id"]
                with receiver.lock:
                    receiver.requests += 1
                    check = receiver.requests % 20 == 1
                if check:
                    try:
                        Webhook(receiver.secret).verify(body, dict(self.headers.items()))
                    except Exception:
                        with receiver.lock:
                            receiver.bad_signatures += 1
                committed = datetime.fromisoformat(json.loads(body)["timestamp"]).timestamp()
                with receiver.lock:
                    receiver.arrivals[msg_id] = receiver.arrivals.get(msg_id, 0) + 1
                    receiver.latencies.setdefault(msg_id, now - committed)
                    receiver.last_at = now
                self.send_response(204)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def start(self) -> None:
        self.server = self._serve(self.port)


class WebhookBenchmark(RecoveryBenchmark):
    def __init__(self, stdout: OutputWrapper) -> None:
        super().__init__(stdout)

    def run(self, **options: Any) -> None:
        scratch = Path(tempfile.mkdtemp(prefix="settle-benchhooks-"))
        database_url = self._scratch_database(scratch)
        broker = os.environ.get("CELERY_BROKER_URL", "")
        if not broker.startswith("redis://"):
            raise CommandError("benchmark_webhooks needs CELERY_BROKER_URL=redis://…")
        queue = f"settle-benchhooks-{uuid.uuid4().hex[:8]}"
        celery_app.conf.broker_url = broker
        celery_app.conf.task_default_queue = queue
        settings.CELERY_TASK_DEFAULT_QUEUE = queue
        settings.SETTLE_WEBHOOK_QUEUE = f"{queue}-webhooks"  # where commits nudge a delivery
        settings.SETTLE_WEBHOOKS_ALLOW_PRIVATE = True
        receiver = _Receiver()
        procs: list[subprocess.Popen[bytes]] = []
        try:
            operations = self._setup(receiver)
            procs = self._start(scratch, options["workers"], database_url, broker, queue)
            self.stdout.write(
                f"database {connections['default'].vendor}, broker {broker}, "
                f"{options['workers']} workers, {os.cpu_count()} CPUs, "
                f"load average {os.getloadavg()[0]:.1f}"
            )
            burst = self._burst(receiver, operations, options["events"], options["timeout"])
            self.stdout.write(f"burst: {json.dumps(burst)}")
            steady = self._steady(receiver, operations, options["rate"], options["timeout"])
            self.stdout.write(f"steady: {json.dumps(steady)}")
            down = self._down(receiver, operations, options["down_seconds"], options["timeout"])
            self.stdout.write(f"receiver down: {json.dumps(down)}")
            hanging = self._hanging(receiver, operations, options["hanging"], options["timeout"])
            self.stdout.write(f"hanging endpoint: {json.dumps(hanging)}")
            self.stdout.write(
                json.dumps(
                    {
                        "deliveries_per_s": burst["deliveries_per_s"],
                        "p95_s": steady["p95_s"],
                        "down_lost": down["lost"],
                        "down_duplicates_same_id": down["duplicates"],
                        "hanging_good_per_s": hanging["good_per_s"],
                        "bad_signatures": receiver.bad_signatures,
                    }
                )
            )
        finally:
            celery_stop(procs)
            receiver.stop()
            connections.close_all()
            # By name, with their bindings: kombu's queue_delete forgets a queue this process
            # never declared, as the default one here (beat's other tasks, no worker).
            owner = redis.Redis.from_url(broker)
            for name in (queue, f"{queue}-webhooks"):
                owner.delete(name, f"_kombu.binding.{name}", f"_kombu.binding_permanent.{name}")
            owner.close()
            if not options["keep"]:
                shutil.rmtree(scratch, ignore_errors=True)

    def _setup(self, receiver: _Receiver) -> list[Operation]:
        host = Host.objects.create(name="bench-hooks", token_hash="sha256:" + uuid.uuid4().hex)
        provider = Provider.objects.create(name="bench-hooks", adapter="journal", path="/dev/null")
        operations = Operation.objects.bulk_create(
            Operation(
                key=f"hook-{n}",
                host=host,
                action="payment.send",
                provider=provider,
                params_canonical="{}",
                params_digest="sha256:" + "0" * 64,
                state=State.RELEASED,
            )
            for n in range(50)
        )
        _, receiver.secret = webhook_endpoint_add(
            host_name=host.name, url=f"http://127.0.0.1:{receiver.port}/hooks", actor=BENCH
        )
        return operations

    def _start(
        self, scratch: Path, workers: int, database_url: str, broker: str, queue: str
    ) -> list[subprocess.Popen[bytes]]:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "settle.settings",
            "DATABASE_URL": database_url,
            "CELERY_BROKER_URL": broker,
            "SETTLE_CELERY_QUEUE": queue,
            "SETTLE_WEBHOOK_QUEUE": f"{queue}-webhooks",
            "SETTLE_WEBHOOKS_ALLOW_PRIVATE": "true",
            "SETTLE_WEBHOOK_SECONDS": "1",
            "SETTLE_AUDIT_CHECKPOINT_FILE": str(scratch / "checkpoints.jsonl"),
        }
        procs, logs = [], []
        for n in range(workers + 1):
            kind = "beat" if n == workers else "worker"
            log = scratch / f"{kind}-{n}.log"
            hooks = "" if kind == "beat" else f"{queue}-webhooks"
            procs.append(celery_start(kind, name=f"hooks{n}", log=log, env=env, queues=hooks))
            logs.append(log)
        self._workers_ready(procs[:workers], logs[:workers])
        return procs

    def _write(self, operations: list[Operation], count: int, start: int) -> None:
        with transaction.atomic():
            webhook_events_record(
                [
                    OutboxEvent(
                        operations[(start + n) % len(operations)],
                        WebhookEvent.RELEASED,
                        {"n": start + n},
                    )
                    for n in range(count)
                ]
            )

    def _wait_all(self, receiver: _Receiver, expected: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(receiver.arrivals) < expected:
            if time.monotonic() > deadline:
                raise CommandError(f"timed out: {len(receiver.arrivals)} of {expected} arrived")
            time.sleep(0.05)

    def _burst(
        self, receiver: _Receiver, operations: list[Operation], count: int, timeout: float
    ) -> dict[str, float]:
        started = time.time()
        for start in range(0, count, 100):
            self._write(operations, min(100, count - start), start)
        written = time.time() - started
        self._wait_all(receiver, count, timeout)
        elapsed = receiver.last_at - started
        return {
            "messages": count,
            "writing_s": round(written, 2),
            "elapsed_s": round(elapsed, 2),
            "deliveries_per_s": round(count / elapsed, 1),
        }

    def _steady(
        self, receiver: _Receiver, operations: list[Operation], rate: int, timeout: float
    ) -> dict[str, float]:
        before = set(receiver.arrivals)
        total = rate * 10
        started = time.monotonic()
        for n in range(total):
            pause = started + n / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            self._write(operations, 1, 10_000_000 + n)
        achieved = total / (time.monotonic() - started)
        self._wait_all(receiver, len(before) + total, timeout)
        latencies = sorted(
            latency for msg_id, latency in receiver.latencies.items() if msg_id not in before
        )
        return {
            "messages": total,
            "rate_per_s": round(achieved, 1),
            "p50_s": round(_percentile(latencies, 0.5), 3),
            "p95_s": round(_percentile(latencies, 0.95), 3),
            "max_s": round(latencies[-1], 3),
        }

    def _down(
        self, receiver: _Receiver, operations: list[Operation], seconds: float, timeout: float
    ) -> dict[str, float]:
        expected = WebhookMessage.objects.count()
        self._wait_all(receiver, expected, timeout)
        receiver.stop()
        started = time.monotonic()
        written = 0
        while time.monotonic() - started < seconds:
            self._write(operations, 1, 20_000_000 + written)
            written += 1
            time.sleep(0.5)
        receiver.start()
        back = time.monotonic()
        back_wall = time.time()
        # Changes go on after the receiver is back, as they would.
        while len(receiver.arrivals) < expected + written:
            if time.monotonic() - back > timeout:
                break
            self._write(operations, 1, 20_000_000 + written)
            written += 1
            time.sleep(1.0)
        try:
            self._wait_all(receiver, expected + written, 60)
        except CommandError as exc:
            self.stdout.write(str(exc))
        total = WebhookMessage.objects.count()
        arrivals = sum(receiver.arrivals.values())
        return {
            "down_s": seconds,
            "written_while_down": int(written),
            "messages": total,
            "received_ids": len(receiver.arrivals),
            "lost": total - len(receiver.arrivals),
            "duplicates": arrivals - len(receiver.arrivals),
            "all_delivered_s_after_back": round(receiver.last_at - back_wall, 1),
        }

    def _hanging(
        self, receiver: _Receiver, operations: list[Operation], count: int, timeout: float
    ) -> dict[str, float]:
        listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
        held: list[socket.socket] = []

        def accept() -> None:
            with contextlib.suppress(OSError):  # the listener closed: done
                while True:
                    held.append(listener.accept()[0])

        threading.Thread(target=accept, daemon=True).start()
        endpoint, _ = webhook_endpoint_add(
            host_name="bench-hooks",
            url=f"http://127.0.0.1:{listener.getsockname()[1]}/hooks",
            actor=BENCH,
        )
        expected = len(receiver.arrivals) + count
        try:
            started = time.time()
            for start in range(0, count, 100):
                self._write(operations, min(100, count - start), 30_000_000 + start)
            try:
                self._wait_all(receiver, expected, timeout)
            except CommandError as exc:
                self.stdout.write(str(exc))
            arrived = count - (expected - len(receiver.arrivals))
            elapsed = receiver.last_at - started
        finally:
            webhook_endpoint_disable(endpoint_id=endpoint.pk, actor=BENCH)
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
            for connection in held:
                connection.close()
        return {
            "messages": count,
            "good_received": arrived,
            "elapsed_s": round(elapsed, 2),
            "good_per_s": round(arrived / elapsed, 1),
            "hanging_requests": len(held),
        }
