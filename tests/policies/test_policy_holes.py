"""What a host could slip past a policy, and what ``policy check`` let through that then
broke every matching opening (issue 35, defects 5 to 8)."""

from __future__ import annotations

import logging

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from common.actors import Actor
from policies.models import BudgetUse, Policy
from policies.policy_file import PolicyError, policy_parse
from policies.rules import MAX_AMOUNT
from policies.services import policy_apply
from tests.support.flow import PARAMS

pytestmark = pytest.mark.django_db


def _apply(source: bytes) -> None:
    policy_apply(source=source, actor=Actor.system("test"))


def _open(flow, key, params):
    flow.register(key, params)
    response = flow.host_api.post(f"/api/v1/operations/{key}/approvals")
    assert response.status_code == 201, response.content
    return response.json()


SUM_BUDGET = b"""
[[rules]]
name = "small"
when = ["/amount <= 500"]
outcome = "approve"

[rules.budget]
window = "24h"
sum = "/amount"
limit = 1000
"""


def test_a_negative_amount_never_refills_a_sum_budget(flow):
    _apply(SUM_BUDGET)
    amounts = [500, 500, -100000, 500, 500, 500]
    statuses = [
        _open(flow, f"op-{n}", {**PARAMS, "amount": amount})["status"]
        for n, amount in enumerate(amounts)
    ]
    # The negative one matched the condition but the budget does not count it: a person.
    assert statuses == ["approved", "approved", "pending", "pending", "pending", "pending"]
    assert sum(use.amount for use in BudgetUse.objects.all()) == 1000


@pytest.mark.parametrize("amount", [float(MAX_AMOUNT), 1e25, 1e300])
def test_an_amount_the_budget_cannot_hold_falls_through_to_a_person(flow, amount):
    """Same answer on SQLite and PostgreSQL (whose numeric column overflowed: 503). The
    host API takes integers within 2**53 only; a float may be as large as 1e308."""
    _apply(SUM_BUDGET.replace(b"/amount <= 500", b"/amount >= 0"))
    opened = _open(flow, "op-huge", {**PARAMS, "amount": amount})
    assert opened["status"] == "pending"
    assert not BudgetUse.objects.exists()


@pytest.mark.parametrize(
    ("condition", "value"),
    [
        ('/currency != "GBP"', ["GBP"]),
        ('/currency != "GBP"', 1),
        ('/currency != "GBP"', None),
        ('/country not in ["IR", "KP"]', ["KP"]),
        ('/country not in ["IR", "KP"]', {"code": "KP"}),
        ('/country not in ["IR", "KP"]', 7),
        ("/amount != 5", "5"),
        ("/amount != 5", True),
    ],
)
def test_a_value_of_another_type_makes_a_negation_false(condition, value):
    policy = policy_parse(
        f'[[rules]]\nname = "r"\nwhen = [{condition!r}]\noutcome = "approve"\n'.encode()
    )
    pointer = condition.split()[0].lstrip("/")
    assert policy.matching(provider="p", action="a", host="h", params={pointer: value}) == []


@pytest.mark.parametrize(
    ("condition", "value"),
    [
        ('/currency != "GBP"', "EUR"),
        ('/country not in ["IR", "KP"]', "FR"),
        ("/amount != 5", 5.5),
        ("/amount not in [1, 2]", 3.0),
    ],
)
def test_a_negation_of_the_same_type_still_matches(condition, value):
    policy = policy_parse(
        f'[[rules]]\nname = "r"\nwhen = [{condition!r}]\noutcome = "approve"\n'.encode()
    )
    pointer = condition.split()[0].lstrip("/")
    assert len(policy.matching(provider="p", action="a", host="h", params={pointer: value})) == 1


@pytest.mark.parametrize(
    ("source", "line", "reason"),
    [
        (b'[[rules]]\nname = "r"\nwhen = ["/amount < NaN"]\noutcome = "approve"\n', 3, "JSON"),
        (b'[[rules]]\nname = "r"\nwhen = ["/amount < 1e400"]\noutcome = "approve"\n', 3, "finite"),
        (b'[[rules]]\nname = "r"\noutcome = "person"\nexpires_after = "3000000d"\n', 4, "at most"),
        (b'[[rules]]\nname = "r"\noutcome = "approve"\npermit_ttl = "8d"\n', 4, "at most 7 days"),
        (
            b'[[rules]]\nname = "r"\noutcome = "approve"\n\n[rules.budget]\ncount = 1\n'
            b'window = "9999999d"\n',
            7,
            "at most",
        ),
        (
            b'[[rules]]\nname = "r"\noutcome = "approve"\n\n[rules.budget]\n'
            b'window = "eventually"\ncount = 1\n',
            6,
            "duration",
        ),
        (b'[providers.pay]\n# who signs\npasskey = "maybe"\n', 3, "passkey must be"),
        (
            b'[[rules]]\nname = "r"\noutcome = "approve"\n\n[rules.budget]\nwindow = "1h"\n'
            b'sum = "/a"\nlimit = "1e30"\n',
            8,
            "budget limit",
        ),
    ],
)
def test_check_refuses_what_would_break_an_opening_naming_the_line(tmp_path, source, line, reason):
    with pytest.raises(PolicyError) as refused:
        policy_parse(source)
    assert (refused.value.line, reason in refused.value.reason) == (line, True), refused.value
    path = tmp_path / "policy.toml"
    path.write_bytes(source)
    for action in (["check"], ["apply", "--yes"]):
        with pytest.raises(CommandError, match=f"line {line}: "):
            call_command("policy", *action, str(path))
    assert not Policy.objects.exists()


def test_the_longest_durations_check_accepts_still_open_approvals(flow):
    _apply(
        b'[[rules]]\nname = "slow"\noutcome = "person"\nexpires_after = "366d"\n'
        b'remind_after = "366d"\n\n[[rules]]\nname = "fast"\noutcome = "approve"\n'
        b'permit_ttl = "7d"\n'
    )
    assert _open(flow, "op-slow", PARAMS)["status"] == "pending"


def test_a_stored_policy_this_version_refuses_asks_one_person(flow, caplog):
    """Applied before the check refused NaN: every opening asks a person, never a 500."""
    source = '[[rules]]\nname = "r"\nwhen = ["/amount < NaN"]\noutcome = "approve"\n'
    from django.utils import timezone

    Policy.objects.create(
        version="sha256:" + "0" * 64,
        source=source,
        applied_at=timezone.now(),
        applied_by=Actor.system("old"),
    )
    with caplog.at_level(logging.ERROR, logger="policies.services"):
        opened = _open(flow, "op-1", PARAMS)
    assert opened["status"] == "pending"
    assert "no longer reads" in caplog.text


def test_policy_show_with_no_policy_says_so_and_fails():
    with pytest.raises(CommandError, match="no policy in force"):
        call_command("policy", "show")
