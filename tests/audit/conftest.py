"""The audit tests' operations, which the chain tests and the streamed-verify tests share."""

from __future__ import annotations

import pytest

from recovery.models import Operation
from recovery.services.registration import operation_register
from tests.support.flow import PARAMS


@pytest.fixture
def operations(host, provider) -> list[Operation]:
    """Three registered operations: three chains of one event each."""
    return [
        operation_register(
            host=host, key=f"op-{n}", action="payment.send", provider_name="orders", params=PARAMS
        )[0]
        for n in range(3)
    ]
