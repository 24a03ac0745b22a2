"""What every text and integer field of the host API's contract (``recovery.contract``)
checks beyond its type: no NUL in text, whole numbers however they are written."""

from __future__ import annotations

from typing import Any

from pydantic import AfterValidator, BeforeValidator
from pydantic_core import PydanticCustomError


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise PydanticCustomError("string_nul", "must not contain NUL")
    return value


class _NoNul(AfterValidator):
    """Refuses text holding NUL; where the field has no pattern of its own, the document
    says so too (``^[^\\x00]*$``), so that what it calls valid is what the server takes."""

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> Any:
        found = handler(schema)
        found.setdefault("pattern", r"^[^\x00]*$")
        return found


NoNul = _NoNul(_no_nul)


def _whole(value: Any) -> Any:
    # JSON has one kind of number, and to JSON Schema (the document's) 300.0 is the
    # integer 300: a host whose encoder writes it so is sending what the document allows.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# An integer field: a whole number, however it is written (300 or 300.0); never text or
# a boolean.
Whole = BeforeValidator(_whole)
