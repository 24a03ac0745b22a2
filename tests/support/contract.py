"""Every response the suite receives from the API is checked against the OpenAPI document.

``tests/conftest.py`` wraps Django's test client with ``response_check``: a status the
document does not list for that path and method, or a body its schema refuses, fails
the test that received it.
"""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

from django.urls import Resolver404, resolve
from jsonschema import Draft202012Validator

from recovery.openapi import openapi_document


class ContractViolation(AssertionError):
    pass


@cache
def _document() -> dict[str, Any]:
    return openapi_document()


def _pointer(*parts: str) -> str:
    return "#/" + "/".join(part.replace("~", "~0").replace("/", "~1") for part in parts)


@cache
def _validator(pointer: str) -> Draft202012Validator:
    # The document is the root, so the schema's own $refs (#/components/…) resolve.
    return Draft202012Validator({**_document(), "$ref": pointer})


def route_template(route: str) -> str:
    """A URL route as the document names its path: ``api/v1/operations/<str:key>`` →
    ``/api/v1/operations/{key}``."""
    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)


def documented_path(path: str) -> str | None:
    """The document's path for a request path (``/api/v1/operations/{key}``), if any."""
    try:
        return route_template(resolve(path).route)
    except Resolver404:
        return None


def response_check(method: str, path: str, status: int, content_type: str, body: bytes) -> str:
    """Raise ``ContractViolation`` unless the response is one the document describes.

    Returns the schema pointer it was checked against.
    """
    if not path.startswith("/api/") or path == "/api/openapi.json":
        return ""
    paths = _document()["paths"]
    template = documented_path(path)
    if template not in paths or method.lower() not in paths[template]:
        # Not a documented operation: only the API's own 404 or 405 may answer.
        if status not in (404, 405):
            raise ContractViolation(f"{method} {path} answered {status}: not documented")
        pointer = _pointer("components", "schemas", "Error")
    else:
        responses = paths[template][method.lower()]["responses"]
        if str(status) not in responses:
            raise ContractViolation(f"{method} {template} answered {status}: not documented")
        pointer = _pointer(
            "paths",
            template,
            method.lower(),
            "responses",
            str(status),
            "content",
            "application/json",
            "schema",
        )
    if method == "HEAD":
        return pointer  # no body to check
    if content_type != "application/json":
        raise ContractViolation(f"{method} {path} answered {content_type!r}, not JSON")
    errors = sorted(_validator(pointer).iter_errors(json.loads(body)), key=str)
    if errors:
        raise ContractViolation(f"{method} {path} {status}: {errors[0].message} at {pointer}")
    return pointer
