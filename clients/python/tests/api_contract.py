"""The server's API document, and the transports that check the client's exchanges with it.

``ContractTransport`` wraps the real transport: every request body the client sends and
every response it parses is validated against the OpenAPI document that server serves at
``/api/openapi.json``, so a change to the contract fails these tests.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
from jsonschema import Draft202012Validator


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
