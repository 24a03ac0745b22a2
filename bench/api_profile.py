"""The host API's CPU per request, endpoint by endpoint, in-process: where it goes.

    python bench/api_profile.py [--lifecycles 300] [--split] [--middleware] [--rate-limit]
        [--combined] [--auto-approve] [--instructions]

No HTTP and no gunicorn: the lifecycle (register → open approval → approve → dispatch →
report committed) is driven through Django's WSGI handler in this process, on a scratch
PostgreSQL database (as ``bench/api.py``'s). What it prints, per endpoint: this process's
CPU (``time.process_time``) per request and the statements per request, ``BEGIN`` and
``COMMIT`` included (``bench/sqlcount.py``). PostgreSQL's own CPU is not in it; the
database round trips' client side is. Counting the statements runs each through Django's
own cursor (``dbsql.cursor``), which costs a lifecycle about 8 % more than the web
server's way.

``--instructions`` counts instead each request's instructions under valgrind
(``bench/instructions.py``): the same figure on every run, whatever else the machine
runs, so two commits compare in one run each; no statements are counted, so the
statements take the web server's way. ``--lifecycles 12`` is plenty (about a minute).
With ``--split`` too, the instructions are split by part (``INSTRUCTION_PARTS``).

``--split`` runs the lifecycles again under cProfile with a CPU clock and splits each
request's CPU into middleware, authentication, rate limit, body parsing, serialisation,
the services (of which: ORM, raw SQL round trips, audit hashing) and the rest.
``--middleware`` prints what each middleware costs a request that goes down the whole
stack (``middleware_costs``). The rate limit is off (as in ``bench/api.py``) unless
``--rate-limit``. ``--combined`` registers and opens the approval in one request;
``--auto-approve`` applies ``bench.policies.twenty_rules`` (a policy approves every
opening) and registers, opens and dispatches in one request, then reports: the
policy-approved lifecycle, two requests; with ``--combined`` too, the dispatch is a
request apart (three requests: what a checkout before ``dispatch`` could be asked does).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import logging
import os
import pstats
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settle.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/settle")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.handlers.wsgi import WSGIHandler  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import override_settings  # noqa: E402

from approvals.services.approvers import approver_create  # noqa: E402
from bench.api_postgres import analyze, scratch_database  # noqa: E402
from bench.instructions import (  # noqa: E402
    Marks,
    Split,
    run_counted,
    split_figures,
    under_callgrind,
)
from bench.policies import twenty_rules  # noqa: E402
from bench.sqlcount import StatementCount, counting, statements_noted  # noqa: E402
from common.actors import COMMAND_LINE  # noqa: E402
from harness.fleet.client import PARAMS  # noqa: E402
from harness.providers import digest_of, sqlite_provider_init  # noqa: E402
from policies.services import policy_apply  # noqa: E402
from recovery.services.credentials import host_create  # noqa: E402
from recovery.services.providers import provider_configure  # noqa: E402

ENDPOINTS = ("register", "open approval", "approve", "dispatch", "report")
# What the driver's own code between two requests is counted as (``--instructions``).
DRIVER = "(the driver)"
# Every name ``Driver.lifecycle`` gives a request.
ENDPOINT_NAMES = (
    *ENDPOINTS,
    "register and open",
    "register, open and dispatch",
)


class Driver:
    """Calls a WSGI handler as gunicorn would, one lifecycle at a time."""

    def __init__(
        self, host_token: str, approver_token: str, combined: bool = False, auto: bool = False
    ) -> None:
        self.tokens = {"host": host_token, "approver": approver_token}
        self.combined = combined
        self.auto = auto
        self.handler = WSGIHandler()
        self.count = StatementCount()
        self.cpu: dict[str, list[float]] = defaultdict(list)
        self.sql: dict[str, list[int]] = defaultdict(list)
        self.serial = 0
        # Set when the instructions are counted (``--instructions``): each request counted.
        self.marks: Marks | None = None

    def call(self, name: str, path: str, body: Any, auth: str = "host") -> dict[str, Any]:
        raw = json.dumps(body).encode() if body is not None else b""
        environ = _environ(
            "POST",
            path,
            raw,
            CONTENT_TYPE="application/json",
            CONTENT_LENGTH=str(len(raw)),
            HTTP_AUTHORIZATION=f"Bearer {self.tokens[auth]}",
        )
        status: list[str] = []
        self.count.__init__()  # type: ignore[misc]
        if self.marks is not None:
            self.marks.mark(DRIVER)
        started = time.process_time()
        chunks = self.handler(environ, lambda s, h, *e: status.append(s))
        content = b"".join(chunks)
        if hasattr(chunks, "close"):
            chunks.close()
        self.cpu[name].append(time.process_time() - started)
        if self.marks is not None:
            self.marks.mark(name)
        self.sql[name].append(self.count.total)
        if not status[0].startswith("2"):
            raise RuntimeError(f"{name}: {status[0]} {content[:300]!r}")
        return json.loads(content) if content else {}

    def lifecycle(self) -> None:
        self.serial += 1
        key = f"prof-{os.getpid()}-{time.monotonic_ns()}-{self.serial}"
        body = {"key": key, "action": "payment.send", "provider": "bench", "params": PARAMS}
        digest = digest_of(PARAMS)
        if self.auto:
            body["approval"] = {}
            if self.combined:  # the dispatch a request apart, as before it could be asked
                self.call("register and open", "/api/v1/operations", body)
                dispatch = {"worker": "w", "params_digest": digest}
                held = self.call("dispatch", f"/api/v1/operations/{key}/dispatch", dispatch)
            else:
                body["dispatch"] = {"worker": "w", "params_digest": digest}
                name = "register, open and dispatch"
                held = self.call(name, "/api/v1/operations", body)["dispatch"]
            result = {"fencing_token": held["fencing_token"], "outcome": "committed"}
            result["provider_reference"] = key
            self.call("report", f"/api/v1/operations/{key}/result", result)
            return
        if self.combined:
            body["approval"] = {}
            opened = self.call("register and open", "/api/v1/operations", body)["approval"]
        else:
            self.call("register", "/api/v1/operations", body)
            opened = self.call("open approval", f"/api/v1/operations/{key}/approvals", None)
        decision = {"decision": "approve", "ttl_seconds": 300, "params_digest": digest_of(PARAMS)}
        path = f"/api/v1/approvals/{opened['approval_id']}/decision"
        self.call("approve", path, decision, auth="approver")
        dispatch = {"worker": "w", "params_digest": digest}
        held = self.call("dispatch", f"/api/v1/operations/{key}/dispatch", dispatch)
        result = {"fencing_token": held["fencing_token"], "outcome": "committed"}
        result["provider_reference"] = key
        self.call("report", f"/api/v1/operations/{key}/result", result)


def _fresh(tokens: tuple[str, str], combined: bool, auto: bool = False) -> Driver:
    driver = Driver(*tokens, combined=combined, auto=auto)
    if not under_callgrind():
        # Not when instructions are counted: a connection whose statements are watched
        # runs each through Django's own cursor (``dbsql.cursor``), not the web server's.
        counting(driver.count)
    return driver


def per_endpoint(driver: Driver) -> list[tuple[str, float, float]]:
    """(endpoint, median CPU ms, median statements) in lifecycle order."""
    return [
        (name, statistics.median(cpu) * 1000, statistics.median(driver.sql[name]))
        for name, cpu in driver.cpu.items()
    ]


def print_instructions(counts: dict[str, list[int]]) -> None:
    """The instructions of each request, by endpoint: median, and the spread."""
    lifecycles = min(len(values) for name, values in counts.items() if name != DRIVER)
    print(f"{lifecycles} lifecycles in-process under valgrind (callgrind)")
    print("| endpoint | instructions per request (median) | lowest - highest |")
    print("| --- | --- | --- |")
    total = 0.0
    for name, values in counts.items():
        if name == DRIVER:
            continue
        median = statistics.median(values)
        total += median
        spread = f"{min(values) / 1e6:.3f}-{max(values) / 1e6:.3f}"
        print(f"| {name} | {median / 1e6:.3f} M | {spread} |")
    print(f"| lifecycle | {total / 1e6:.3f} M | |")


# What ``--instructions --split`` counts apart: each part's functions' own instructions,
# less those of the other parts' functions they call. The API's views are a part too
# (``_instruction_split``): what is left of the services' code once the rest is apart.
INSTRUCTION_PARTS: dict[str, tuple[str, ...]] = {
    "Django's handler (request, response, signals)": (
        "django.core.handlers.wsgi:WSGIHandler.__call__",
    ),
    "middleware (request id, metrics, the token's shortcut)": (
        "settle.logs:RequestIdMiddleware.__call__",
        "settle.metrics:HostApiMetricsMiddleware.__call__",
        "recovery.middleware:TokenRequestMiddleware.__call__",
    ),
    "URL resolver": ("django.urls:resolve",),
    "authentication and rate limit": ("recovery.api:_authenticate", "recovery.api:_rate_limit"),
    "body parsing": ("recovery.api:_json_body", "recovery.api:_parse"),
    "answer (serialisation)": ("recovery.api:_answer", "django.http:JsonResponse.__init__"),
    "audit hashing": ("audit.hashing:event_hash",),
    "statements written out (dbsql)": (
        "dbsql.rows:model_from_row",
        "dbsql.rows:select_locked_with",
        "dbsql.rows:select_first_at",
        "dbsql.columns:saved_values",
        "dbsql.writes:insert",
        "dbsql.writes:insert_sql",
        "dbsql.writes:update_sql",
        "dbsql.writes:update_returning",
    ),
    "model instances (Model.__init__)": ("django.db.models:Model.__init__",),
    "psycopg and libpq (each statement's client side)": (
        "psycopg:Cursor.execute",
        "dbsql.cursor:_run",
        "dbsql.cursor:KeptCursor.fetchone",
        "dbsql.cursor:KeptCursor.fetchall",
        "psycopg:Cursor.fetchone",
        "psycopg:Cursor.fetchall",
    ),
    "transactions (atomic: BEGIN, COMMIT)": (
        "django.db.transaction:Atomic.__enter__",
        "django.db.transaction:Atomic.__exit__",
    ),
}
VIEWS = "the views and services (the rest of Settle's code)"


def _instruction_split(marks: Marks) -> Split:
    from recovery import urls

    split = Split(marks, INSTRUCTION_PARTS, rest="(outside the requests)")
    for pattern in urls.urlpatterns:
        pattern.callback = split.wrapped(VIEWS, pattern.callback)
    return split


def print_instruction_split(figures: dict[str, int], counts: dict[str, list[int]]) -> None:
    requests = sum(len(values) for name, values in counts.items() if name in ENDPOINT_NAMES)
    figures = {part: count for part, count in figures.items() if part not in ENDPOINT_NAMES}
    total = sum(figures.values())
    print(f"\n| part (instructions per request, {requests} requests) | instructions | share |")
    print("| --- | --- | --- |")
    for part, count in sorted(figures.items(), key=lambda item: -item[1]):
        print(f"| {part} | {count / requests / 1e6:.3f} M | {100 * count / total:.0f} % |")
    print(f"| whole request | {total / requests / 1e6:.3f} M | |")


# -- the split -----------------------------------------------------------------------

# Inclusive CPU of these functions, by (file suffix, function name). A part's figure is
# its functions' own cumulative time; nested parts are subtracted where they nest.
PARTS: dict[str, tuple[tuple[str, str], ...]] = {
    "whole request": (("django/core/handlers/wsgi.py", "__call__"),),
    # The API's views through ``api_view``: whatever the way from the handler to them.
    "the view": (("recovery/api.py", "wrapper"),),
    "authentication": (("recovery/api.py", "_authenticate"),),
    "rate limit": (("recovery/api.py", "_rate_limit"),),
    "body parsing": (("recovery/api.py", "_json_body"), ("recovery/contract.py", "parse")),
    "serialisation": (("recovery/api.py", "_answer"),),
    "audit hashing": (("audit/chain.py", "audit_append"),),
    "ORM (building queries and rows)": (("django/db/models/sql/compiler.py", "execute_sql"),),
    "round trips (psycopg execute)": (
        ("psycopg/cursor.py", "execute"),
        ("psycopg/cursor.py", "executemany"),
    ),
    "transaction commit": (("django/db/backends/base/base.py", "commit"),),
}


def split(driver: Driver, lifecycles: int) -> dict[str, float]:
    """CPU ms per request in each part (``PARTS``), from a cProfile with a CPU clock."""
    profile = cProfile.Profile(time.process_time)
    profile.enable()
    for _ in range(lifecycles):
        driver.lifecycle()
    profile.disable()
    stats = pstats.Stats(profile)
    requests = lifecycles * len(driver.cpu)
    figures: dict[str, float] = {}
    for part, functions in PARTS.items():
        total = 0.0
        for (filename, _, name), row in stats.stats.items():  # type: ignore[attr-defined]
            if any(filename.endswith(f) and name == n for f, n in functions):
                total += row[3]
        figures[part] = total / requests * 1000
    figures["handler and middleware"] = figures["whole request"] - figures["the view"]
    return figures


# -- the middleware, one at a time ------------------------------------------------------


FLOOR_PATH = "/api/v1/operations/floor"


def _environ(method: str, path: str, raw: bytes, **headers: str) -> dict[str, Any]:
    """A WSGI request as gunicorn hands it to Django, with ``headers`` (``HTTP_*`` and the
    content's) added."""
    return {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "HTTP_HOST": "127.0.0.1",
        "wsgi.input": io.BytesIO(raw),
        "wsgi.url_scheme": "http",
        "wsgi.errors": sys.stderr,
        **headers,
    }


def _floor_cpu(handler: WSGIHandler, requests: int, headers: dict[str, str]) -> float:
    """CPU ms per request of ``requests`` GETs answered 401 by the view, before any SQL."""
    started = time.process_time()
    for _ in range(requests):
        environ = _environ("GET", FLOOR_PATH, b"", **headers)
        b"".join(handler(environ, lambda s, h, *e: None))
    return (time.process_time() - started) / requests * 1000


def middleware_costs(requests: int, rounds: int) -> list[tuple[str, float]]:
    """CPU ms each middleware costs a request that the view refuses before any SQL.

    The request carries no ``Authorization`` header, so that it goes down the whole
    stack, as every token's request did before ``recovery.middleware``; the stack is
    cut from its innermost end, one more middleware each time (so that none runs
    without one it depends on, as authentication on sessions), rounds alternated: a
    middleware's cost is the difference between the stack down to it and the stack
    above it.
    """
    stack = list(settings.MIDDLEWARE)
    samples: dict[int, list[float]] = defaultdict(list)
    # Django logs each 401 as a warning: the same for every stack, and not what is measured.
    logging.getLogger("django.request").setLevel(logging.ERROR)
    for _ in range(rounds):
        for depth in range(len(stack), -1, -1):
            with override_settings(MIDDLEWARE=stack[:depth]):
                handler = WSGIHandler()
                _floor_cpu(handler, 50, {})  # warm
                samples[depth].append(_floor_cpu(handler, requests, {}))
    median = {depth: statistics.median(values) for depth, values in samples.items()}
    costs = [(name, median[i + 1] - median[i]) for i, name in enumerate(stack)]
    return [
        ("(none: Django's handler, the URL resolver and the view's 401)", median[0]),
        *costs,
        ("(all of them)", median[len(stack)] - median[0]),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lifecycles", type=int, default=300)
    parser.add_argument("--split", action="store_true", help="also profile the split")
    parser.add_argument("--middleware", action="store_true", help="also each middleware's cost")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of --middleware")
    parser.add_argument(
        "--statements", action="store_true", help="print one lifecycle's statements"
    )
    parser.add_argument("--rate-limit", action="store_true", help="keep the rate limit on")
    parser.add_argument(
        "--combined", action="store_true", help="register and open the approval in one request"
    )
    parser.add_argument(
        "--auto-approve",
        action="store_true",
        help="a policy approves every opening; register, open and dispatch in one request",
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count each request's instructions under valgrind instead (bench/instructions.py)",
    )
    args = parser.parse_args()
    if args.instructions and not under_callgrind():
        counts, calls = run_counted([__file__, *sys.argv[1:]])
        if calls:  # --split: the requests' own marks count only what no part holds
            print_instruction_split(split_figures(counts, calls), counts)
        else:
            print_instructions(counts)
        return
    if connection.vendor != "postgresql":
        sys.exit("bench/api_profile.py measures PostgreSQL: set DATABASE_URL=postgres://…")
    if args.rate_limit:
        # On, counted in the shared cache, but never reached by one token's lifecycles.
        settings.SETTLE_HOST_RATE_PER_SECOND = 1_000_000
        settings.SETTLE_HOST_RATE_BURST = 2_000_000
    else:
        settings.SETTLE_HOST_RATE_PER_SECOND = 0
    settings.ALLOWED_HOSTS = ["127.0.0.1"]
    with scratch_database(), _provider() as tokens:
        if args.auto_approve:
            policy_apply(source=twenty_rules(paying_action="payment.send"), actor=COMMAND_LINE)
        driver = _fresh(tokens, args.combined, args.auto_approve)
        for _ in range(20):
            driver.lifecycle()  # warm: prepared statements, imports, caches
        analyze()
        driver = _fresh(tokens, args.combined, args.auto_approve)
        split = None
        if under_callgrind():
            driver.marks = Marks()
            if args.split:
                split = _instruction_split(driver.marks)
            driver.marks.start()
            if split is not None:
                split.on = True
                split.calibrate()
        for _ in range(args.lifecycles):
            driver.lifecycle()
        if under_callgrind():
            if split is not None:
                split.save()
            return  # the parent prints the counts
        print(f"load {os.getloadavg()[0]:.2f}; {args.lifecycles} lifecycles in-process")
        print("| endpoint | CPU ms per request (median) | statements |")
        print("| --- | --- | --- |")
        rows = per_endpoint(driver)
        for name, cpu, sql in rows:
            print(f"| {name} | {cpu:.2f} | {sql:g} |")
        total_cpu = sum(r[1] for r in rows)
        print(f"| lifecycle | {total_cpu:.2f} | {sum(r[2] for r in rows):g} |")
        if args.statements:
            with statements_noted() as noted:
                _fresh(tokens, args.combined, args.auto_approve).lifecycle()
            print("\n" + "\n".join(sql[:160] for sql in noted))
        if args.split:
            figures = split(_fresh(tokens, args.combined, args.auto_approve), args.lifecycles)
            print("\n| part (CPU ms per request, cProfile clock) | ms |\n| --- | --- |")
            for part, ms in figures.items():
                print(f"| {part} | {ms:.3f} |")
        if args.middleware:
            print("\n| middleware | CPU ms per request (401, no SQL) |\n| --- | --- |")
            for name, cost in middleware_costs(args.lifecycles * 10, args.rounds):
                print(f"| `{name}` | {cost:+.3f} |")
            # The same request with an Authorization header: the token's way through.
            handler = WSGIHandler()
            signed = {"HTTP_AUTHORIZATION": "Basic not-a-bearer-token"}
            _floor_cpu(handler, 50, signed)
            floor = statistics.median(
                _floor_cpu(handler, args.lifecycles * 10, signed) for _ in range(args.rounds)
            )
            print(f"| all of it, the request carrying an Authorization header | {floor:.3f} |")


class _provider:
    """The bench's provider, host and approver on the scratch database."""

    def __enter__(self) -> tuple[str, str]:
        import tempfile

        self.scratch = tempfile.TemporaryDirectory()
        path = Path(self.scratch.name) / "orders.sqlite3"
        sqlite_provider_init(path)
        provider_configure(name="bench", adapter="sqlite", path=str(path), lease_seconds=60)
        _, host_token = host_create(name="bench-host")
        _, approver_token = approver_create(name="bench-approver", all_providers=True)
        return host_token, approver_token

    def __exit__(self, *exc: object) -> None:
        self.scratch.cleanup()


if __name__ == "__main__":
    main()
