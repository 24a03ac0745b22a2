"""The action in plain words: ``[[actions]]`` in the policy file, and its rendering."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from approvals.models import Approval
from common.actors import Actor
from policies.policy_file import PolicyError, policy_parse
from policies.rules import NO_POLICY
from policies.services import policies_at, policy_apply, policy_at
from policies.summaries import action_summary, params_list
from tests.support.console import pending_approval

OFFSET = "/d is not an ISO 8601 date and time with its offset"
PAY = {"amount": "1250.50", "currency": "EUR", "to": "acct-7", "on": "2026-12-05"}

POLICY = b"""
[[rules]]
name = "all"
outcome = "person"

[[actions]]
provider = "orders"
action = "payment.send"
summary = "Pay {/amount:money:/currency} to {/to} on {/on:date}"

[[actions]]
action = "*"
summary = "Run {/what} {{literally}}"
"""


def _summary(summary: str, params, *, action="payment.send", provider="orders", **kwargs):
    policy = policy_parse(
        f'[[actions]]\naction = "*"\nsummary = "{summary}"\n'.encode() if summary else b""
    )
    return action_summary(policy, provider, action, params, **kwargs)


# -- the file ----------------------------------------------------------------------------


def test_actions_read_in_order_with_their_placeholders():
    policy = policy_parse(POLICY)
    first, second = policy.actions
    assert (first.provider, first.action, first.line) == ("orders", "payment.send", 6)
    assert (second.provider, second.action, second.line) == ("*", "*", 11)
    assert [part if isinstance(part, str) else part.text for part in first.parts] == [
        "Pay ",
        "{/amount:money:/currency}",
        " to ",
        "{/to}",
        " on ",
        "{/on:date}",
    ]
    assert first.parts[1].format == "money" and first.parts[1].currency.path == "/currency"
    assert policy.summary_for(provider="orders", action="payment.send") is first
    assert policy.summary_for(provider="ledger", action="payment.send") is second


@pytest.mark.parametrize(
    ("source", "line", "reason"),
    [
        (b'[[actions]]\naction = "a"\nsummary = "x"\ncolour = "red"\n', 4, "unknown key 'colour'"),
        (b'[[actions]]\nsummary = "x"\n', 1, "an action needs action"),
        (b'[[actions]]\naction = "a"\n', 1, "needs a summary"),
        (b'[[actions]]\naction = "a"\nsummary = ""\n', 3, "summary must be a sentence"),
        (b'[[actions]]\naction = "a"\nsummary = 5\n', 3, "summary must be a sentence"),
        (b'[[actions]]\naction = "a"\nprovider = ""\nsummary = "x"\n', 3, "provider must be"),
        (b'[[actions]]\naction = "a"\n\nsummary = "Pay {/amount"\n', 4, "not closed"),
        (b'[[actions]]\naction = "a"\nsummary = "Pay {/a{/b}}"\n', 3, "not closed"),
        (b'[[actions]]\naction = "a"\nsummary = "Pay /amount}"\n', 3, "a lone '}'"),
        (b'[[actions]]\naction = "a"\nsummary = "Pay {}"\n', 3, "must name a parameter"),
        (b'[[actions]]\naction = "a"\nsummary = "Pay {amount}"\n', 3, "must name a parameter"),
        (b'[[actions]]\naction = "a"\nsummary = "Pay {/a~2}"\n', 3, "not a JSON Pointer"),
        (b'[[actions]]\naction = "a"\nsummary = "Pay {/a:cash}"\n', 3, "unknown format 'cash'"),
        (b'[[actions]]\naction = "a"\nsummary = "Pay {/a:money}"\n', 3, "unknown format"),
        (b'[[actions]]\naction = "a"\nsummary = "Pay {/a:date:/b}"\n', 3, "unknown format"),
        (b'[[actions]]\naction = "a"\nsummary = "Pay {/a:}"\n', 3, "unknown format ''"),
        (b'[[actions]]\naction = "a"\nsummary = "{/a:money:c}"\n', 3, "not a JSON Pointer"),
        (
            b'[[actions]]\naction = "a"\nsummary = "' + b"x" * 301 + b'"\n',
            3,
            "at most 300 characters",
        ),
        (b'actions = "pay"\n', 1, "array of tables"),
        (b'[[actions]]\naction = "a"\nsummary = "x"\n[[actions]]\nsummary = "y"\n', 4, "needs"),
        (
            # The second table's key, not the first's: each is looked for in its own table.
            b'[[actions]]\naction = "a"\nsummary = "x"\n\n[[actions]]\naction = "b"\n'
            b'summary = "{/x:euro}"\n',
            7,
            "unknown format",
        ),
        (
            # After a rule: the action's lines are its own, not the rule's.
            b'[[rules]]\nname = "r"\noutcome = "deny"\n[[actions]]\naction = "a"\n'
            b'summary = "{x}"\n',
            6,
            "must name a parameter",
        ),
    ],
)
def test_a_bad_action_is_refused_with_its_line(source, line, reason):
    with pytest.raises(PolicyError) as refused:
        policy_parse(source)
    assert refused.value.line == line
    assert reason in str(refused.value)


def test_policy_check_counts_the_summaries_and_names_a_bad_ones_line(tmp_path, capsys):
    good = tmp_path / "policy.toml"
    good.write_bytes(POLICY)
    call_command("policy", "check", str(good))
    assert "1 rules, 2 action summaries" in capsys.readouterr().out
    bad = tmp_path / "bad.toml"
    bad.write_bytes(POLICY.replace(b"{/on:date}", b"{/on:day}"))
    with pytest.raises(CommandError, match=r"bad.toml: line 9: summary: \{/on:day\}: unknown"):
        call_command("policy", "check", str(bad))


# -- rendering ---------------------------------------------------------------------------


def test_the_summary_renders_money_and_dates_in_the_locale():
    policy = policy_parse(POLICY)
    english = action_summary(policy, "orders", "payment.send", PAY)
    assert english.rendered and english.unavailable == ""
    assert english.sentence == "Pay €1,250.50 to acct-7 on December 5, 2026"
    german = action_summary(policy, "orders", "payment.send", PAY, locale="de-DE")
    assert german.sentence == "Pay 1.250,50\xa0€ to acct-7 on 5. Dezember 2026"
    unknown = action_summary(policy, "orders", "payment.send", PAY, locale="xx-nowhere")
    assert unknown.sentence == english.sentence


def test_an_amount_is_never_rounded_and_may_be_a_number():
    assert _summary("{/a:money:/c}", {"a": "12.345", "c": "EUR"}).sentence == "€12.345"
    assert _summary("{/a:money:/c}", {"a": 1250, "c": "JPY"}).sentence == "¥1,250"
    assert _summary("{/a:money:/c}", {"a": 0.1, "c": "USD"}).sentence == "$0.10"


def test_a_datetime_reads_in_its_own_offset():
    sentence = _summary("At {/at:datetime}", {"at": "2026-12-05T19:30:00+01:00"}).sentence
    assert sentence.startswith("At December 5, 2026") and "7:30:00" in sentence
    assert sentence.endswith("+0100")


def test_a_value_without_format_is_the_string_or_its_json():
    params = {"s": "plain", "n": 7, "b": True, "z": None, "l": [1, "x"], "o": {"k": 1}}
    sentence = _summary("{/s} {/n} {/b} {/z} {/l} {/o} {{ok}}", params).sentence
    assert sentence == 'plain 7 true null [1,"x"] {"k":1} {ok}'


@pytest.mark.parametrize(
    ("summary", "params", "unavailable"),
    [
        ("Pay {/to}", {"amount": 1}, "/to missing"),
        ("Pay {/to/iban}", {"to": "acct"}, "/to/iban missing"),
        ("{/a:money:/c}", {"a": 1}, "/c missing"),
        ("{/a:money:/c}", {"a": "ten", "c": "EUR"}, "/a is not an amount"),
        ("{/a:money:/c}", {"a": "1e3", "c": "EUR"}, "/a is not an amount"),
        ("{/a:money:/c}", {"a": "NaN", "c": "EUR"}, "/a is not an amount"),
        ("{/a:money:/c}", {"a": True, "c": "EUR"}, "/a is not an amount"),
        ("{/a:money:/c}", {"a": [1], "c": "EUR"}, "/a is not an amount"),
        ("{/a:money:/c}", {"a": 1, "c": "eur"}, "/c is not a currency code such as EUR"),
        ("{/a:money:/c}", {"a": 1, "c": 978}, "/c is not a currency code such as EUR"),
        ("{/a:money:/c}", {"a": 1, "c": "XYZ"}, "/c: XYZ is not a currency"),
        ("{/d:date}", {"d": "5 Dec 2026"}, "/d is not an ISO 8601 date"),
        ("{/d:date}", {"d": 20261205}, "/d is not an ISO 8601 date"),
        ("{/d:date}", {"d": "2026-12-05T10:00:00Z"}, "/d is not an ISO 8601 date"),
        ("{/d:datetime}", {"d": "2026-12-05T10:00:00"}, OFFSET),
        ("{/d:datetime}", {"d": "tomorrow"}, OFFSET),
    ],
)
def test_a_placeholder_that_cannot_be_filled_gives_the_parameter_list(summary, params, unavailable):
    found = _summary(summary, params)
    assert not found.rendered and found.sentence == ""
    assert found.unavailable == unavailable
    assert found.params == params_list(params)


def test_without_a_summary_for_the_action_the_parameters_are_listed():
    policy = policy_parse(POLICY.split(b'[[actions]]\naction = "*"')[0])
    found = action_summary(
        policy, "orders", "refund", {"amount": 5, "to": {"iban": "DE01", "a/b": ["x", {}]}}
    )
    assert not found.rendered
    assert found.unavailable == "the policy has no summary for orders refund"
    assert found.params == (
        ("/amount", "5"),
        ("/to/iban", "DE01"),
        ("/to/a~1b/0", "x"),
        ("/to/a~1b/1", "{}"),
    )
    assert action_summary(NO_POLICY, "orders", "refund", {}).params == (("/", "{}"),)


def test_the_text_is_plain_for_the_page_to_escape():
    found = _summary("<b>{/to}</b>", {"to": "<script>alert(1)</script>"})
    assert found.sentence == "<b><script>alert(1)</script></b>"
    assert not hasattr(found.sentence, "__html__")


# -- the version an approval opened under ---------------------------------------------------


@pytest.mark.django_db
def test_an_approval_keeps_the_summary_of_the_policy_it_opened_under(flow):
    policy_apply(source=POLICY, actor=Actor.system("test"))
    approval = pending_approval(flow, "pay-1", params=PAY)
    assert approval.policy_version == policy_parse(POLICY).version
    changed = POLICY.replace(b"Pay {/amount", b"Send {/amount")
    policy_apply(source=changed, actor=Actor.system("test"))
    later = pending_approval(flow, "pay-2", params=PAY)

    def sentence(approval: Approval) -> str:
        policy = policy_at(approval.policy_version)
        return action_summary(policy, approval.provider, approval.action, PAY).sentence

    assert sentence(approval).startswith("Pay €1,250.50")
    assert sentence(later).startswith("Send €1,250.50")
    both = policies_at({approval.policy_version, later.policy_version, ""})
    assert both[""] is NO_POLICY
    assert both[approval.policy_version].version == approval.policy_version


@pytest.mark.django_db
def test_a_version_no_row_holds_reads_as_no_policy():
    assert policy_at("sha256:" + "9e" * 32) is NO_POLICY
    assert policy_at("") is NO_POLICY
