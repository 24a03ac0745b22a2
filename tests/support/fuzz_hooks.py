"""Schemathesis hooks for the contract fuzzer (``tests/integration/test_contract_fuzz.py``).

Loaded by ``st run`` through ``SCHEMATHESIS_HOOKS``. A registration the fuzzer makes up
names a provider nobody configured, which is a 404 before anything else is looked at;
a request meant to be valid names the one the test configured (``SETTLE_FUZZ_PROVIDER``)
instead, so that registrations succeed and the stateful phase can follow their links.
Half of them (by their key) name the action that the test's policy approves as it opens
(``SETTLE_FUZZ_AUTO_ACTION``), so that the links from them reach a permit, its dispatch
and its report without a person's decision. A customer's ``contact`` is taken only where
the operator's settings allow its scheme and server, which no schema can say and which
the test's Settle allows none of: a request meant to be valid leaves it out.
"""

from __future__ import annotations

import os
from typing import Any

import schemathesis

PROVIDER = os.environ.get("SETTLE_FUZZ_PROVIDER", "")
AUTO_ACTION = os.environ.get("SETTLE_FUZZ_AUTO_ACTION", "")


@schemathesis.hook
def map_case(context: Any, case: Any) -> Any:
    meta = case.meta
    positive = meta is not None and meta.generation.mode.is_positive
    if (
        PROVIDER
        and positive
        and case.method.upper() == "POST"
        and case.operation.path == "/api/v1/operations"
        and isinstance(case.body, dict)
        and isinstance(case.body.get("provider"), str)
    ):
        body = {**case.body, "provider": PROVIDER}
        if AUTO_ACTION and len(str(body.get("key", ""))) % 2 == 0:
            body["action"] = AUTO_ACTION
        case.body = body
    if positive and isinstance(case.body, dict):
        case.body = _without_contact(case.body)
    return case


def _without_contact(body: dict[str, Any]) -> dict[str, Any]:
    """The body without a party's ``contact`` (an enrolment's, or an opening's party's)."""
    body = {key: value for key, value in body.items() if key != "contact"}
    for holder in (body, body.get("approval")):
        if isinstance(holder, dict) and isinstance(holder.get("party"), dict):
            holder["party"] = {k: v for k, v in holder["party"].items() if k != "contact"}
    return body
