"""What policies cost an approval's opening, in-process, on a scratch database.

    python manage.py benchmark_policies [--openings 300]

Three variants of one opening (``recovery.services.permits.approval_open``), interleaved
round by round so that the machine's drift falls on all three alike:

* ``no policy``: no policy was ever applied (as before policies existed);
* ``20 rules, a person``: twenty rules, one with a budget, none of which matches: the
  opening asks one person, as without a policy;
* ``20 rules, budget pays``: the same twenty rules, the last an ``approve`` rule whose
  budget pays: the opening also spends the budget and approves (issues the permit),
  which saves the host its decision request.

Each reports p50/p95 wall time and the SQL statements (BEGIN and COMMIT included, as
``bench/core.py`` counts them on PostgreSQL). Before policies, an opening had no policy
step at all; the step alone (``policies.services.approval_terms``: which version is in
force, then the twenty rules evaluated against the parameters, none matching) is measured
on its own as well: it is what policies add to an opening that a person decides.
``bench/api.py --auto-approve`` measures the auto-approved lifecycle over HTTP.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from django.core.management.base import OutputWrapper
from django.db import connection
from django.test.utils import CaptureQueriesContext

from bench.scratch import scratch_database_use
from common.actors import Actor
from harness.providers import sqlite_provider_init
from policies.models import Policy
from policies.services import approval_terms, policy_apply
from recovery.services.credentials import host_create
from recovery.services.permits import approval_open
from recovery.services.providers import provider_configure
from recovery.services.registration import operation_register

BENCH = Actor.system("bench")
PARAMS = {"amount": 1250, "currency": "EUR", "to": "acct-7", "memo": "benchmark"}


def twenty_rules(*, paying_action: str) -> bytes:
    """Nineteen rules that do not match ``bench``'s openings, then one whose budget pays
    for every opening of ``paying_action`` (a count and a sum far above what a run spends)."""
    rules = []
    for n in range(19):
        rules.append(
            f'[[rules]]\nname = "other-{n}"\nprovider = "bench"\naction = "transfer.{n}"\n'
            f'when = ["/amount > {n * 1000}", \'/currency in ["EUR", "USD"]\']\n'
            'outcome = "quorum"\napprovals = 2\n'
        )
    rules.append(
        f'[[rules]]\nname = "agents"\nprovider = "bench"\naction = "{paying_action}"\n'
        'when = ["/amount <= 5000", \'/to matches "acct-[0-9]+"\']\noutcome = "approve"\n\n'
        '[rules.budget]\nper = "host"\nwindow = "24h"\ncount = 100000000\n'
        'sum = "/amount"\nlimit = 1000000000000\n'
    )
    return "\n".join(rules).encode()


class PolicyBenchmark:
    def __init__(self, out: OutputWrapper) -> None:
        self.out = out

    def run(self, *, openings: int, **_: Any) -> None:
        with tempfile.TemporaryDirectory() as scratch:
            scratch_database_use(Path(scratch), "_bench_policies")
            self._run(openings, Path(scratch))

    def _run(self, openings: int, scratch: Path) -> None:
        provider_db = scratch / "orders.sqlite3"
        sqlite_provider_init(provider_db)
        provider_configure(name="bench", adapter="sqlite", path=str(provider_db))
        host, _ = host_create(name="bench-host")
        variants = ("no policy", "20 rules, a person", "20 rules, budget pays")
        seconds: dict[str, list[float]] = {name: [] for name in variants}
        statements: dict[str, list[int]] = {name: [] for name in variants}
        policy = twenty_rules(paying_action="payment.pay")
        for i in range(openings):
            for name in variants:
                Policy.objects.all().delete()
                if name != "no policy":
                    policy_apply(source=policy, actor=BENCH)
                action = "payment.pay" if name.endswith("pays") else "payment.send"
                operation, _ = operation_register(
                    host=host,
                    key=f"{i}-{name}",
                    action=action,
                    provider_name="bench",
                    params=PARAMS,
                )
                with CaptureQueriesContext(connection) as queries:
                    started = time.perf_counter()
                    approval, _ = approval_open(operation=operation, host=host)
                    seconds[name].append(time.perf_counter() - started)
                statements[name].append(len(queries.captured_queries))
                expected = "approved" if name.endswith("pays") else "pending"
                assert approval.status == expected, (name, approval.status)
        step: list[float] = []
        step_statements: list[int] = []
        for i in range(openings):
            with CaptureQueriesContext(connection) as queries:
                started = time.perf_counter()
                terms = approval_terms(
                    provider="bench",
                    action="payment.send",
                    host="bench-host",
                    params=PARAMS,
                    approval_id=i,
                )
                step.append(time.perf_counter() - started)
            step_statements.append(len(queries.captured_queries))
            assert terms.outcome == "people" and not terms.rule.name
        seconds["the policy step alone"] = step
        statements["the policy step alone"] = step_statements
        self.out.write(f"database: {connection.vendor}; {openings} openings per variant\n")
        self.out.write(f"{'opening an approval':<26} {'p50 ms':>8} {'p95 ms':>8} {'SQL':>5}\n")
        for name in seconds:
            ordered = sorted(seconds[name])
            p50 = statistics.median(ordered) * 1000
            p95 = ordered[max(0, int(len(ordered) * 0.95) - 1)] * 1000
            sql = statistics.mean(statements[name])
            self.out.write(f"{name:<26} {p50:>8.2f} {p95:>8.2f} {sql:>5.0f}\n")
