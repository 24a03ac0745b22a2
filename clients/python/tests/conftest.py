"""The client's tests run against a live Settle: every request and answer is checked.

Set ``SETTLE_URL``, ``SETTLE_HOST_TOKEN``, ``SETTLE_APPROVER_TOKEN`` and ``SETTLE_PROVIDER``
(a provider the approver may approve for), and for the callback test
``SETTLE_CALLBACK_PROVIDER`` and ``SETTLE_CALLBACK_SECRET`` (an http provider's name and
secret). ``.ci/run`` starts gunicorn, a worker and beat and sets them. Without
``SETTLE_URL`` every test here skips and says so.

``ContractTransport`` wraps the real transport: every request body the client sends and
every response it parses is validated against the OpenAPI document that server serves at
``/api/openapi.json``, so a change to the contract fails these tests.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator

URL = os.environ.get("SETTLE_URL", "")


class ContractViolation(AssertionError):
    pass


class Contract:
    """The server's OpenAPI document, and the checks of one exchange against it."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.paths = [
            (re.compile("^" + re.sub(r"\{\w+\}", "[^/]+", path) + "$"), path)
            for path in document["paths"]
        ]
        self.checked: list[str] = []

    def _validate(self, pointer: str, value: Any, what: str) -> None:
        validator = Draft202012Validator({**self.document, "$ref": pointer})
        problems = [error.message for error in validator.iter_errors(value)]
        if problems:
            raise ContractViolation(f"{what}: {problems[:3]} in {value}")

    def _template(self, path: str) -> str:
        for pattern, template in self.paths:
            if pattern.match(path):
                return template
        raise ContractViolation(f"{path} is not in the API document")

    def check(self, request: httpx.Request, response: httpx.Response) -> None:
        template = self._template(request.url.path)
        method = request.method.lower()
        operation = self.document["paths"][template].get(method)
        if operation is None:
            raise ContractViolation(f"{request.method} {template} is not documented")
        what = f"{request.method} {template}"
        body = request.content
        if body:
            schema = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if schema is None:
                raise ContractViolation(f"{what} takes no body")
            pointer = "#/paths/" + _escape(template) + f"/{method}/requestBody/content/"
            self._validate(pointer + "application~1json/schema", json.loads(body), what)
        status = str(response.status_code)
        if status not in operation["responses"]:
            raise ContractViolation(f"{what} answered {status}: not documented")
        pointer = "#/paths/" + _escape(template) + f"/{method}/responses/{status}/content/"
        response.read()
        self._validate(pointer + "application~1json/schema", response.json(), f"{what} → {status}")
        self.checked.append(f"{what} {status}")


def _escape(path: str) -> str:
    return path.replace("~", "~0").replace("/", "~1")


class ContractTransport(httpx.HTTPTransport):
    def __init__(self, contract: Contract) -> None:
        super().__init__()
        self.contract = contract

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        self.contract.check(request, response)
        return response


class AsyncContractTransport(httpx.AsyncHTTPTransport):
    def __init__(self, contract: Contract) -> None:
        super().__init__()
        self.contract = contract

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        await response.aread()
        self.contract.check(request, response)
        return response


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
