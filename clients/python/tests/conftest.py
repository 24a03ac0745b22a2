"""The client's tests run against a live Settle: every request and answer is checked.

Set ``SETTLE_URL``, ``SETTLE_HOST_TOKEN``, ``SETTLE_APPROVER_TOKEN`` and ``SETTLE_PROVIDER``
(a provider the approver may approve for), and for the callback test
``SETTLE_CALLBACK_PROVIDER`` and ``SETTLE_CALLBACK_SECRET`` (an http provider's name and
secret). ``.ci/run`` starts gunicorn, a worker and beat and sets them. Without
``SETTLE_URL`` every test here skips and says so.

``ContractTransport`` (``api_contract.py``) checks every exchange against the OpenAPI
document that server serves at ``/api/openapi.json``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import httpx
import pytest
from api_contract import Contract, ContractTransport

URL = os.environ.get("SETTLE_URL", "")


@pytest.fixture(scope="session")
def server() -> dict[str, str]:
    if not URL:
        pytest.skip("SETTLE_URL is not set: these tests need a live Settle (see conftest)")
    return {
        "url": URL,
        "host_token": os.environ["SETTLE_HOST_TOKEN"],
        "approver_token": os.environ["SETTLE_APPROVER_TOKEN"],
        "provider": os.environ["SETTLE_PROVIDER"],
    }


@pytest.fixture(scope="session")
def contract(server: dict[str, str]) -> Contract:
    document = httpx.get(server["url"] + "/api/openapi.json", timeout=30).json()
    return Contract(document)


@pytest.fixture
def transport(contract: Contract) -> Iterator[ContractTransport]:
    yield ContractTransport(contract)


@pytest.fixture
def key() -> str:
    return f"client-{uuid.uuid4().hex[:16]}"
