"""The policy file is read whole or refused whole, with the line and the reason."""

from __future__ import annotations

from decimal import Decimal

import pytest

from policies.policy_file import PolicyError, policy_parse

GOOD = b"""
[providers.orders]
passkey = "required"

[[rules]]
name = "small"
provider = "orders"
action = "payment.send"
when = ["/amount <= 5000", '/currency in ["EUR", "USD"]', '/to matches "acct-[0-9]+"']
outcome = "approve"

[rules.budget]
per = "host"
window = "24h"
count = 20
sum = "/amount"
limit = "500.00"

[[rules]]
name = "large"
when = ["/amount > 100000"]
outcome = "quorum"
approvals = 2
groups = ["finance"]
passkey = true
expires_after = "4h"
"""


def test_a_good_file_reads_into_ordered_rules():
    policy = policy_parse(GOOD)
    assert [rule.name for rule in policy.rules] == ["small", "large"]
    assert policy.passkey_providers == {"orders"}
    assert policy.version.startswith("sha256:")
    small = policy.rules[0]
    assert small.budget is not None and small.budget.limit == Decimal("500.00")
    assert small.budget.count == 20
    assert policy.rules[1].approvals == 2 and policy.rules[1].passkey


@pytest.mark.parametrize(
    ("params", "matched"),
    [
        ({"amount": 1250, "currency": "EUR", "to": "acct-7"}, ["small"]),
        ({"amount": 1250, "currency": "GBP", "to": "acct-7"}, []),
        ({"amount": 1250, "currency": "EUR", "to": "acct-7x"}, []),
        ({"amount": "1250", "currency": "EUR", "to": "acct-7"}, []),  # a string is no number
        ({"currency": "EUR", "to": "acct-7"}, []),  # a missing value matches nothing
        ({"amount": 100001, "currency": "EUR"}, ["large"]),
        ({"amount": 100000.5}, ["large"]),
    ],
)
def test_conditions_compare_through_json_pointer(params, matched):
    policy = policy_parse(GOOD)
    found = policy.matching(provider="orders", action="payment.send", host="h", params=params)
    assert [rule.name for rule in found] == matched


def test_a_rule_for_another_provider_action_or_host_does_not_match():
    policy = policy_parse(
        b'[[rules]]\nname = "r"\nprovider = "orders"\naction = "a"\nhosts = ["h1"]\n'
        b'outcome = "deny"\n'
    )
    assert policy.matching(provider="orders", action="a", host="h1", params={})
    assert not policy.matching(provider="ledger", action="a", host="h1", params={})
    assert not policy.matching(provider="orders", action="b", host="h1", params={})
    assert not policy.matching(provider="orders", action="a", host="h2", params={})


@pytest.mark.parametrize(
    ("source", "line", "reason"),
    [
        (b'[[rules]]\nname = "a"\noutcome = "approve\n', 3, "line 3"),
        (b'[[rules]]\nname = "a"\noutcome = "maybe"\n', 3, "outcome must be one of"),
        (b'[[rules]]\nname = "a"\n\noutcome = "deny"\ncolour = "red"\n', 5, "unknown key 'colour'"),
        (b'[[rules]]\nname = "a"\nwhen = ["amount > 5"]\noutcome = "deny"\n', 3, "a condition is"),
        (b'[[rules]]\nname = "a"\nwhen = ["/amount > five"]\noutcome = "deny"\n', 3, "not a JSON"),
        (b'[[rules]]\nname = "a"\nwhen = [\'/to matches "("\']\noutcome = "deny"\n', 3, "pattern"),
        (b'[[rules]]\nname = "a"\nwhen = [\'/c in "EUR"\']\noutcome = "deny"\n', 3, "JSON array"),
        (b'[[rules]]\nname = "a"\noutcome = "quorum"\napprovals = 1\n', 4, "approvals = 2..20"),
        (b'[[rules]]\nname = "a"\noutcome = "deny"\npasskey = true\n', 4, "person and quorum"),
        (
            b'[[rules]]\nname = "a"\noutcome = "person"\n'
            b'[rules.budget]\nwindow = "1h"\ncount = 1\n',
            4,
            "only an approve rule",
        ),
        (
            b'[[rules]]\nname = "a"\noutcome = "approve"\n[rules.budget]\nwindow = "1 day"\n',
            5,  # the key's own line, not the table's header
            "duration",
        ),
        (
            b'[[rules]]\nname = "a"\noutcome = "approve"\n'
            b'[rules.budget]\nwindow = "1h"\nsum = "/x"\n',
            4,
            "sum and limit go together",
        ),
        (
            b'[[rules]]\nname = "a"\noutcome = "deny"\n\n[[rules]]\nname = "a"\noutcome = "deny"\n',
            5,
            "another rule",
        ),
        (b'[providers.orders]\npasskey = "always"\n', 2, "required"),
        (b'colour = "red"\n', 1, "unknown key"),
        (b"\xff\xfe", 0, "UTF-8"),
    ],
)
def test_a_bad_file_is_refused_whole_with_its_line_and_reason(source, line, reason):
    with pytest.raises(PolicyError) as refused:
        policy_parse(source)
    assert refused.value.line == line
    assert reason in str(refused.value)
