"""The policy in force, read-only, and its budgets' use on the policy page and dashboard."""

from __future__ import annotations

from common.actors import Actor
from policies.services import policy_apply
from tests.support.console import client_for, console_user
from tests.support.flow import PARAMS

POLICY = b"""
[providers.orders]
passkey = "required"

[[rules]]
name = "small"
provider = "orders"
when = ["/amount <= 2000"]
outcome = "approve"
reason = "small payments need nobody"

[rules.budget]
window = "24h"
count = 5
sum = "/amount"
limit = 3000

[[rules]]
name = "pair"
outcome = "quorum"
approvals = 2
groups = ["finance"]
"""


def test_a_supervisor_reads_the_rules_and_what_the_budget_spent(flow, provider):
    policy_apply(source=POLICY, actor=Actor.system("test"))
    flow.register("op-1", PARAMS)
    opened = flow.host_api.post("/api/v1/operations/op-1/approvals").json()
    assert opened["status"] == "approved"
    sam = console_user("sam", "supervisor", provider)
    page = client_for(sam).get("/policy/")
    assert page.status_code == 200
    text = page.content.decode()
    for expected in ("small payments need nobody", "/amount &lt;= 2000", "2 people", "finance"):
        assert expected in text
    assert 'id="rule-small"' in text and "orders" in text  # the passkey provider
    assert "1 of 5" in text and "1250.00 of 3000.00" in text
    board = client_for(sam).get("/dashboard/").content.decode()
    assert "Budgets in use" in board and "1250.00 of 3000.00" in board and "fleet-a" in board


def test_without_a_policy_the_page_says_one_person_decides(provider):
    sam = console_user("sam", "supervisor", provider)
    page = client_for(sam).get("/policy/")
    assert "No policy has been applied" in page.content.decode()


def test_people_who_neither_supervise_nor_decide_may_not_read_it(provider):
    olivia = console_user("olivia", "operator", provider)
    assert client_for(olivia).get("/policy/").status_code == 403
    dora = console_user("dora", "decide_approvals", provider)
    assert client_for(dora).get("/policy/").status_code == 200
    assert client_for(None).get("/policy/").status_code == 302
