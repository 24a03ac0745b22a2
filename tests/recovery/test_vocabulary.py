"""Every audit kind and stale signal the code writes is a member of its ``TextChoices``.

Read from the source (AST), so a free string added anywhere fails here before it
reaches a hash chain, and a member nothing writes any more fails too.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from django.conf import settings

from audit.kinds import AuditKind
from audit.refusals import refusal_append
from recovery.selectors.operation_page import _event_summary
from recovery.services.stale_signals import stale_signal
from recovery.vocabulary import StaleSignal

ROOT = Path(__file__).resolve().parents[2]
# Settle's own shipped apps, every one: a new app is read without naming it here.
APPS = [a for a in settings.INSTALLED_APPS if a != "bench" and (ROOT / a / "apps.py").is_file()]


def _calls(name: str) -> list[tuple[str, ast.Call]]:
    """Every call of a function named ``name`` in the apps, with its file."""
    found = []
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if called == name:
                    found.append((str(path.relative_to(ROOT)), node))
    return found


def _members(value: ast.expr, words: str) -> set[str] | None:
    """The members of ``words`` that ``value`` can be, or None if it can be anything else."""
    if isinstance(value, ast.IfExp):
        body, orelse = _members(value.body, words), _members(value.orelse, words)
        return None if body is None or orelse is None else body | orelse
    if (
        isinstance(value, ast.Attribute)
        and isinstance(value.value, ast.Name)
        and value.value.id == words
    ):
        return {value.attr}
    return None


def _written(function: str, keyword: str, words: str) -> tuple[set[str], list[str]]:
    """The members passed as ``keyword`` to ``function``, and the calls that pass anything else."""
    members: set[str] = set()
    free = []
    for path, call in _calls(function):
        for kw in call.keywords:
            if kw.arg != keyword:
                continue
            found = _members(kw.value, words)
            if found is None:
                free.append(f"{path}:{call.lineno}: {ast.unparse(kw.value)}")
            else:
                members |= found
    return members, free


def _kinds_written() -> tuple[set[str], list[str]]:
    """The kinds passed to ``audit_append``, and to ``refusal_append`` (its refusals')."""
    members, free = _written("audit_append", "kind", "AuditKind")
    refusals, free_refusals = _written("refusal_append", "kind", "AuditKind")
    # ``refusal_append`` passes on its own parameter, which it checks is a refusal kind.
    home = Path(inspect.getsourcefile(refusal_append) or "").resolve().relative_to(ROOT)
    free = [entry for entry in free if entry.split(":")[0] != str(home)]
    return members | refusals, free + free_refusals


def test_every_audit_event_kind_written_is_an_audit_kind():
    members, free = _kinds_written()
    assert free == []
    assert members <= set(AuditKind.names)


def test_every_audit_kind_is_written_somewhere():
    """A member nothing writes is a filter that finds nothing: remove it, or write it."""
    members, _ = _kinds_written()
    assert set(AuditKind.names) - members == set()


def _signal_entries() -> tuple[set[str], list[str]]:
    """The members written as a stale signal's ``"signal"`` entry straight into its data."""
    members: set[str] = set()
    free = []
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.Dict):
                    continue
                for key, value in zip(node.keys, node.values, strict=True):
                    if isinstance(key, ast.Constant) and key.value == "signal":
                        found = _members(value, "StaleSignal")
                        if found is None:
                            free.append(f"{path.relative_to(ROOT)}: {ast.unparse(value)}")
                        else:
                            members |= found
    return members, free


def test_every_stale_signal_recorded_is_a_stale_signal():
    members, free = _written("stale_signal", "signal", "StaleSignal")
    judged, free_judged = _written("_Judgement", "signal", "StaleSignal")
    in_data, free_in_data = _signal_entries()
    # What the evidence rules decided (``_Judgement.signal``, typed StaleSignal), passed on;
    # and ``stale_signal``'s own parameter, written into the event's data.
    assert [entry.split(": ", 1)[1] for entry in free] == ["judgement.signal"]
    # The one free entry is ``stale_signal``'s own parameter, wherever that function lives.
    home = Path(inspect.getsourcefile(stale_signal) or "").resolve().relative_to(ROOT)
    assert free_in_data == [f"{home}: signal"]
    assert free_judged == []
    assert members | judged | in_data == set(StaleSignal.names)


# The kinds the timeline words from their data; every other kind reads as its label.
WORDED = {
    AuditKind.TRANSITION,
    AuditKind.EVIDENCE,
    AuditKind.STALE_SIGNAL,
    AuditKind.OPERATOR_ACTION,
    AuditKind.OPERATOR_REFUSED,
    AuditKind.RECEIPT_RECOVERED,
    AuditKind.RECONCILIATION_PROPOSED,
    AuditKind.RECONCILIATION_APPROVED,
    AuditKind.RECONCILIATION_REJECTED,
    AuditKind.SIGNATURE_REFUSED,
    AuditKind.RECONCILIATION_INVALIDATED,
    AuditKind.LOOKUP_ABANDONED,
    AuditKind.CONSUME_REFUSED,
    AuditKind.HOST_REPORT,
}


def test_the_timeline_reads_every_kind_and_signal_by_its_label():
    for kind in AuditKind:
        summary = _event_summary(kind.value, {})
        if kind in WORDED:
            assert summary != kind.label and kind.value not in summary, kind
        else:
            assert summary == kind.label, kind
    assert _event_summary("claimed", {}) == "Claimed"
    assert _event_summary("permit_revoke_ignored", {}) == "Permit revocation ignored"
    late = _event_summary("stale_signal", {"signal": "heartbeat_after_lease"})
    assert late == "Stale signal, not applied: Heartbeat after the lease lapsed"


def test_a_kind_or_signal_written_by_another_version_still_reads():
    assert _event_summary("something_new", {}) == "Something new"
    assert _event_summary("stale_signal", {"signal": "early_bird"}) == (
        "Stale signal, not applied: Early bird"
    )
