"""The JSON Schema of an operation's ``params``, as the OpenAPI document states it.

``ParamsValue<n>`` is a value with at most n levels of objects and arrays inside it
(itself included), so that the schema says the depth ``common.canonical`` allows. Numbers
are within ±(2^53-1): a float beyond, such as 1e21, is also taken as written, but only the
safe range is promised, as the same value written with integer digits is refused. Text
has no NUL.
"""

from __future__ import annotations

from typing import Any

from common.canonical import MAX_DEPTH, MAX_PARAMS_BYTES, MAX_SAFE_INTEGER

PARAMS_VALUE = "ParamsValue{levels}"
# Where the OpenAPI document keeps its schemas (``recovery.openapi``).
REF = "#/components/schemas/{model}"
_NO_NUL = r"^[^\x00]*$"
_SCALAR = {
    "minimum": -MAX_SAFE_INTEGER,
    "maximum": MAX_SAFE_INTEGER,
    "pattern": _NO_NUL,
}


def _params_value(levels: int) -> dict[str, str]:
    return {"$ref": REF.format(model=PARAMS_VALUE.format(levels=levels))}


def params_value_schemas() -> dict[str, dict[str, Any]]:
    """The ``ParamsValue<n>`` schemas, for the document's components."""
    schemas: dict[str, dict[str, Any]] = {
        PARAMS_VALUE.format(levels=0): {
            "type": ["null", "boolean", "number", "string"],
            **_SCALAR,
        }
    }
    for levels in range(1, MAX_DEPTH):
        inner = _params_value(levels - 1)
        schemas[PARAMS_VALUE.format(levels=levels)] = {
            "type": ["null", "boolean", "number", "string", "array", "object"],
            **_SCALAR,
            "items": inner,
            "propertyNames": {"pattern": _NO_NUL},
            "additionalProperties": inner,
        }
    return schemas


def params_schema() -> dict[str, Any]:
    """The schema of ``params``: an object at depth 1, its values one level down."""
    return {
        "type": "object",
        "description": f"At most {MAX_PARAMS_BYTES // 1024} KiB canonical (RFC 8785), "
        f"depth ≤ {MAX_DEPTH}, finite numbers within ±(2^53-1), text without NUL.",
        "propertyNames": {"pattern": _NO_NUL},
        "additionalProperties": _params_value(MAX_DEPTH - 1),
    }
