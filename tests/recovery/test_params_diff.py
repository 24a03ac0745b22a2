"""Which parameters differ between the intended action and the provider's record."""

from __future__ import annotations

import json

from recovery.params_diff import (
    MISSING,
    ParamDifference,
    params_diff,
    params_rows,
    provider_digest,
    provider_params,
)


def test_equal_parameters_have_no_difference():
    params = {"amount": 1250, "to": {"iban": "DE1", "tags": ["a", "b"]}}
    assert params_diff(params, json.loads(json.dumps(params))) == []


def test_nested_keys_and_list_elements_are_dotted_paths():
    intended = {"amount": 1250, "to": {"iban": "DE1", "tags": ["a", "b"]}, "memo": "x"}
    provider = {"amount": 9, "to": {"iban": "DE2", "tags": ["a"]}, "extra": None}
    assert params_diff(intended, provider) == [
        ParamDifference("amount", 1250, 9),
        ParamDifference("extra", MISSING, None),
        ParamDifference("memo", "x", MISSING),
        ParamDifference("to.iban", "DE1", "DE2"),
        ParamDifference("to.tags.1", "b", MISSING),
    ]


def test_json_types_count_true_is_not_1_but_1_is_1_0():
    assert [d.path for d in params_diff({"a": True, "b": 1}, {"a": 1, "b": 1.0})] == ["a"]


def test_an_object_replaced_by_a_scalar_is_one_difference_that_flags_its_leaves():
    intended = {"to": {"iban": "DE1", "bic": "X"}, "amount": 5}
    differences = params_diff(intended, {"to": "DE1", "amount": 5})
    assert differences == [ParamDifference("to", {"bic": "X", "iban": "DE1"}, "DE1")]
    rows = params_rows(intended, differences)
    assert [(row.path, row.differs) for row in rows] == [
        ("amount", False),
        ("to.bic", True),
        ("to.iban", True),
    ]
    assert differences[0].intended_text == '{"bic":"X","iban":"DE1"}'
    assert ParamDifference("m", "x", MISSING).provider_text == "(not present)"


def test_the_provider_params_are_read_where_each_adapter_keeps_them():
    sqlite = {"order": {}, "receipt": {"params_json": '{"amount":9}', "params_digest": "d1"}}
    assert provider_params(sqlite) == {"amount": 9} and provider_digest(sqlite) == "d1"
    journal = {"line_number": 3, "record": {"params": {"amount": 7}, "params_digest": "d2"}}
    assert provider_params(journal) == {"amount": 7} and provider_digest(journal) == "d2"
    # A record that keeps only the digest, an unreadable one, no record at all.
    assert provider_params({"record": {"params_digest": "d3"}}) is None
    assert provider_params({"receipt": {"params_json": "{not json"}}) is None
    assert provider_params({"receipt": {"params_json": '{"a":1,"a":2}'}}) is None
    assert provider_params({}) is None and provider_digest({}) is None
    assert provider_params(None) is None
