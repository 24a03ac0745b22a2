"""Schemathesis hooks for the contract fuzzer (``tests/integration/test_contract_fuzz.py``).

Loaded by ``st run`` through ``SCHEMATHESIS_HOOKS``. A registration the fuzzer makes up
names a provider nobody configured, which is a 404 before anything else is looked at;
a request meant to be valid names the one the test configured (``SETTLE_FUZZ_PROVIDER``)
instead, so that registrations succeed and the stateful phase can follow their links.
"""

from __future__ import annotations

import os
from typing import Any

import schemathesis

PROVIDER = os.environ.get("SETTLE_FUZZ_PROVIDER", "")


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
        case.body = {**case.body, "provider": PROVIDER}
    return case
