"""Fifty hosts' processes open approvals against one budget at once, through gunicorn.

The budget (per provider and action) may approve at most 1000.00 EUR. Each of the 50
operations asks for 37.00 to 45.00; together they ask for far more. However the
requests interleave, the total the budget approved never passes the limit by a cent,
every opening it could not pay for falls through to a person, and the budget's own
record (``BudgetUse``) adds up to what was approved.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest
from django.db import connection

from approvals.models import Approval
from common.actors import Actor
from harness.gunicorn import REPO_ROOT, database_url, gunicorn_running
from policies.models import BudgetUse
from policies.services import policy_apply
from recovery.models import Provider
from recovery.services.credentials import host_create
from tests.support.flow import Api

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

HOSTS = 50
LIMIT = Decimal("1000.00")
POLICY = b"""
[[rules]]
name = "agents-spend"
provider = "orders"
action = "payment.send"
outcome = "approve"

[rules.budget]
per = "action"
window = "24h"
sum = "/amount"
limit = "1000.00"

[[rules]]
name = "a-person"
outcome = "person"
"""


def test_fifty_hosts_at_once_never_pass_the_budget_by_a_cent(
    tmp_path: Path, provider: Provider
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("gunicorn's workers share the PostgreSQL test database")
    policy_apply(source=POLICY, actor=Actor.system("test"))
    hosts = []
    for n in range(HOSTS):
        _, token = host_create(name=f"agent-{n}")
        amount = 37 + (n % 9) + (n % 7) / 100  # 37.00 .. 45.06
        registered = Api(token).post(
            "/api/v1/operations",
            {
                "key": f"pay-{n}",
                "action": "payment.send",
                "provider": "orders",
                "params": {"amount": amount, "currency": "EUR", "to": f"acct-{n}"},
            },
        )
        assert registered.status_code == 201, registered.content
        hosts.append((token, f"pay-{n}", Decimal(str(amount))))
    asked = {key: amount for _, key, amount in hosts}
    assert sum(asked.values()) > 2 * LIMIT
    with gunicorn_running(
        database_url=database_url(connection.settings_dict),
        log_path=tmp_path / "gunicorn.log",
        workers=4,
        # Threads, so that all fifty requests are in flight together, not four at a time.
        env={"GUNICORN_CMD_ARGS": "--threads 13"},
    ) as server:
        start = time.time() + 3.0  # every process started and waiting by then
        procs = [
            subprocess.Popen(
                [sys.executable, "tests/procs/open_at.py", server.url, key, str(start)],
                cwd=REPO_ROOT,
                env={**os.environ, "SETTLE_HOST_TOKEN": token},
                stdout=subprocess.PIPE,
                text=True,
            )
            for token, key, _ in hosts
        ]
        answers = []
        for proc in procs:
            out, _ = proc.communicate(timeout=120)
            answers.append(json.loads(out))
    assert all(answer["status"] == 201 for answer in answers), (answers, server.log_tail())
    approved = {a["body"]["approval_id"] for a in answers if a["body"]["status"] == "approved"}
    pending = [a["body"] for a in answers if a["body"]["status"] == "pending"]
    assert approved and pending
    assert all(
        body["rule"] == "a-person" and body["needed"] == "0 of 1 approvals" for body in pending
    )
    rows = Approval.objects.filter(pk__in=approved)
    total = sum((asked[row.operation_key] for row in rows), Decimal(0))
    assert total <= LIMIT
    # What did not fit would not have: the smallest refused amount passes the limit too.
    smallest_left = min(
        asked[Approval.objects.get(pk=b["approval_id"]).operation_key] for b in pending
    )
    assert total + smallest_left > LIMIT
    uses = BudgetUse.objects.filter(budget="agents-spend", scope="orders/payment.send")
    assert {str(use.approval_id) for use in uses} == approved
    assert sum((use.amount for use in uses), Decimal(0)) == total
    assert all(row.rule == "agents-spend" for row in rows)
