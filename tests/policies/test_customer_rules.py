"""Policy rules that ask the customer: ``customer``, ``customer_and_staff``,
``customer_passkey``."""

from __future__ import annotations

from datetime import timedelta

import pytest

from policies.policy_file import PolicyError, policy_parse
from policies.rules import DEFAULT_CUSTOMER_EXPIRY
from policies.services import approval_terms


def _rule(body: str):
    return policy_parse(f'[[rules]]\nname = "r"\n{body}\n'.encode()).rules[0]


def test_a_customer_rule_expires_by_default_and_may_require_the_passkey():
    rule = _rule('outcome = "customer"\ncustomer_passkey = true')
    assert rule.outcome == "customer" and rule.customer_passkey
    assert rule.expires_after == DEFAULT_CUSTOMER_EXPIRY
    assert _rule('outcome = "customer"\nexpires_after = "15m"').expires_after == timedelta(
        minutes=15
    )


def test_customer_and_staff_takes_the_staff_persons_keys():
    rule = _rule('outcome = "customer_and_staff"\ngroups = ["payments"]\npasskey = true')
    assert rule.groups == ("payments",) and rule.passkey


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ('outcome = "customer"\ngroups = ["x"]', "groups is for staff"),
        ('outcome = "customer"\npasskey = true', "passkey is for staff"),
        ('outcome = "customer_and_staff"\napprovals = 2', "one person"),
        ('outcome = "person"\ncustomer_passkey = true', "customer_passkey is for customer"),
        ('outcome = "approve"\ncustomer_passkey = true', "customer_passkey is for person"),
        ('outcome = "customer"\ncustomer_passkey = "yes"', "true or false"),
    ],
)
def test_a_customer_rule_refuses_what_it_cannot_mean(body, reason):
    with pytest.raises(PolicyError) as refused:
        _rule(body)
    assert reason in refused.value.reason


def test_the_terms_say_whom_it_asks():
    policy = policy_parse(
        b'[[rules]]\nname = "c"\noutcome = "customer_and_staff"\ncustomer_passkey = true\n'
    )
    terms = approval_terms(
        provider="orders", action="pay", host="h", params={}, approval_id=None, policy=policy
    )
    assert terms.outcome == "people" and terms.customer == "customer_and_staff"
    assert terms.customer_passkey and not terms.passkey
