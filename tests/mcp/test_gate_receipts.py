"""What settle-mcp answers a repeat of a finished call, from Settle's record of it."""

from __future__ import annotations

import mcp_types as types
from settle_client.canonical import params_digest
from settle_client.mcp.gate import MAX_RESULT_BYTES, _from_receipt, _kept

SCHEMA = {"type": "object", "properties": {"payment_id": {"type": "string"}}}
TOOL = types.Tool(name="send_payment", input_schema={"type": "object"}, output_schema=SCHEMA)
UNTYPED = types.Tool(name="send_note", input_schema={"type": "object"})


def _recovered(raw: object, verdict: str = "match") -> dict:
    return {
        "state": "released",
        "receipt": {"recovered": True, "provider_reference": "ref-1", "result": None},
        "evidence": [{"verdict": verdict, "raw": {"record": raw}}],
    }


def test_a_kept_result_is_answered_as_the_first_call_answered():
    first = {"content": [{"type": "text", "text": "ok"}], "structuredContent": {"payment_id": "p"}}
    record = {"state": "released", "receipt": {"result": {"tool_result": first}}}
    answer = _from_receipt("send_payment", record, TOOL)
    assert answer.structured_content == {"payment_id": "p"} and not answer.is_error


def test_a_recovered_call_answers_the_result_its_evidence_gave():
    raw = {"found": True, "operation_key": "k", "result": {"payment_id": "pay-k"}}
    answer = _from_receipt("send_payment", _recovered(raw), TOOL)
    assert answer.structured_content == {"payment_id": "pay-k"} and not answer.is_error
    assert '"payment_id": "pay-k"' in answer.content[0].text


def test_evidence_that_did_not_match_gives_no_result():
    raw = {"found": True, "operation_key": "k", "result": {"payment_id": "other"}}
    answer = _from_receipt("send_payment", _recovered(raw, verdict="mismatch"), TOOL)
    assert answer.structured_content is None


def test_without_a_result_a_typed_tool_is_told_in_an_error_result_never_to_run_it_again():
    """An answer without structured content for a tool with an output schema is refused
    by the agent's SDK client; an error result carries the words instead."""
    typed = _from_receipt("send_payment", _recovered({"found": True}), TOOL)
    assert typed.is_error and "do not call it with a new key" in typed.content[0].text
    assert "Reference: ref-1" in typed.content[0].text
    untyped = _from_receipt("send_note", _recovered({"found": True}), UNTYPED)
    assert not untyped.is_error and "already completed" in untyped.content[0].text


def _answer(structured: object) -> types.CallToolResult:
    text = types.TextContent(type="text", text="ok")
    return types.CallToolResult(content=[text], structured_content=structured)


def test_a_result_is_kept_whole_with_its_canonical_digest_as_the_reference():
    answer = _answer({"payment_id": "p", "note": "é ✓"})
    kept, reference = _kept(answer)
    whole = answer.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert kept == {"tool_result": whole}
    assert reference == params_digest(whole)


def test_a_result_settle_would_not_keep_is_kept_by_its_digest():
    wide = _answer({"blob": "x" * MAX_RESULT_BYTES})
    kept, reference = _kept(wide)
    whole = wide.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert kept == {"tool_result_digest": reference, "truncated": True}
    assert reference == params_digest(whole)
    # Deeper than any params may nest: no canonical form, yet a digest, never an error.
    deep: dict = {}
    for _ in range(12):
        deep = {"d": deep}
    kept, reference = _kept(_answer(deep))
    assert kept == {"tool_result_digest": reference, "truncated": True}
    assert reference.startswith("sha256:") and len(reference) == 71
