"""The host protocol, written once, without I/O.

``lifecycle`` is a generator: it yields what to do next (``Call`` an endpoint, ``Sleep``,
run the ``Effect``) and is sent what came of it; an error answer is thrown into it as the
typed exception. ``Host`` drives it with blocking calls and a heartbeat thread,
``AsyncHost`` with ``await`` and a heartbeat task, so the rules below exist once:

- Register (idempotent), check that Settle computed the digest this client did.
- Where a policy approves it as it opens, the registration itself dispatched (the
  ``dispatch`` it asked for, bound to this client's digest): run the effect at once.
- Awaiting approval: open it (idempotent), tell ``on_approval`` (if that returns the
  decision it made, ``Approver.approve``'s ``Decided``, that is the answer), else wait for
  the decision within ``approval_timeout`` (``ApprovalTimeout``; ``ApprovalDenied`` /
  ``ApprovalExpired``).
- Approved: dispatch with the digest. A dispatch is never sent twice: if its answer is
  lost, or another worker won the permit, resume says what happened.
- Holding the dispatch: run the effect, report ``committed`` (the effect's reference) or
  ``failed`` (it raised). A report refused for a lapsed lease, or lost, goes to resume.
- Everything else is resume: ``released`` and ``closed`` end it, ``reconcile`` raises
  ``NeedsOperator``; ``in_progress``, ``unknown`` and ``wait`` are asked again after
  ``retry_after`` until ``settle_timeout``. Resume never hands out a second dispatch, so a
  process re-running ``run`` after a crash never calls the effect again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from settle_client import errors

OPERATIONS = "/api/v1/operations"
DECISIONS = frozenset(
    {"wait", "dispatch", "in_progress", "released", "unknown", "reconcile", "closed"}
)


@dataclass(frozen=True)
class Call:
    """One request; ``retry``: it may be sent again if the connection failed."""

    method: str
    path: str
    body: dict[str, Any] | None = None
    retry: bool = True


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Effect:
    """Run the effect under ``fencing_token``; ``lease_seconds`` if the answer said (else 0)."""

    fencing_token: str
    lease_seconds: float


@dataclass(frozen=True)
class EffectResult:
    reference: str | None
    error: BaseException | None
    result: dict[str, Any] | None = None


Step = Call | Sleep | Effect


@dataclass(frozen=True)
class Outcome:
    """How ``run`` ended.

    ``state`` is the operation's state (``released`` or ``failed``); ``recovered`` says
    evidence from the provider settled it, not a worker's report. ``ran_effect`` says
    this call ran the effect; ``reference`` is what the effect returned (``None`` when it
    did not run here); ``error`` is the exception the effect raised, reported ``failed``.
    """

    key: str
    state: str
    recovered: bool
    ran_effect: bool = False
    reference: str | None = None
    error: BaseException | None = None

    @property
    def released(self) -> bool:
        return self.state == "released"


@dataclass(frozen=True)
class Run:
    """What ``run`` was asked to do, and its bounds."""

    key: str
    action: str
    provider: str
    params: dict[str, Any]
    digest: str
    worker: str
    approval_timeout: float
    settle_timeout: float
    poll_interval: float
    # Seconds a read of the operation may be held for the approval's decision (?wait=);
    # 0: read and sleep poll_interval.
    wait: int = 0
    on_approval: Callable[[str], object] | None = None
    # The customer the host acts for (``{"id", "name", "contact"?}``), named when the
    # approval opens; where the policy asks the customer, its answer carries their link.
    party: dict[str, Any] | None = None

    def opening(self) -> dict[str, Any]:
        """The body that opens the approval."""
        return {"party": self.party} if self.party is not None else {}

    def path(self, endpoint: str = "") -> str:
        return operation_path(self.key, endpoint)


def operation_path(key: str, endpoint: str = "") -> str:
    return f"{OPERATIONS}/{quote(key, safe='')}{endpoint}"


def decision_read(key: str, wait: int) -> Call:
    """A read of operation ``key`` that Settle may hold until its approval is decided, at
    most ``wait`` seconds (none asked below 1)."""
    return Call("GET", operation_path(key, f"?wait={wait}" if wait >= 1 else ""))


def held_whole(sent: float, wait: int) -> bool:
    """Whether a read sent at ``sent`` (``time.monotonic()``) was held its whole ``wait``:
    then ask again at once; a server that answered sooner holds no reads (wait on this
    side before asking again)."""
    return wait >= 1 and time.monotonic() - sent >= wait


# A host's customers (parties): the requests ``Host`` and ``AsyncHost`` send alike.


def _party_path(party: str, endpoint: str = "") -> str:
    return f"/api/v1/parties/{quote(party, safe='')}{endpoint}"


def party_read(party: str) -> Call:
    return Call("GET", _party_path(party))


def party_enrolment(party: str, name: str, contact: str) -> Call:
    body = {field: value for field, value in (("name", name), ("contact", contact)) if value}
    # Not sent again: each request makes a new link (and records it).
    return Call("POST", _party_path(party, "/enrolments"), body, retry=False)


def party_passkey_removal(party: str, passkey_id: int) -> Call:
    return Call("DELETE", _party_path(party, f"/passkeys/{int(passkey_id)}"))


def lease_seconds(lease_expires_at: Any) -> float:
    """Seconds of lease left by this machine's clock (0 if the time cannot be read)."""
    try:
        expires = datetime.fromisoformat(str(lease_expires_at))
    except ValueError:
        return 0.0
    if expires.tzinfo is None:
        expires = expires.replace(tzinfo=UTC)
    return max(0.0, (expires - datetime.now(UTC)).total_seconds())


def _field(body: dict[str, Any], name: str, kind: type, endpoint: str) -> Any:
    value = body.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise errors.ProtocolError(f"{endpoint} answered without a valid {name!r}: {body}")
    return value


def lifecycle(run: Run) -> Generator[Step, Any, Outcome]:
    # The approval is opened with the registration (``approval``), when it awaits one;
    # where a policy approves it as it opens, the same request dispatches (``dispatch``,
    # with this client's digest: Settle consumes the permit only for exactly that).
    body = {"key": run.key, "action": run.action, "provider": run.provider, "params": run.params}
    dispatch = {"worker": run.worker, "params_digest": run.digest}
    asked = {"approval": run.opening(), "dispatch": dispatch}
    summary = yield Call("POST", OPERATIONS, {**body, **asked})
    if _field(summary, "params_digest", str, "register") != run.digest:
        raise errors.ProtocolError(
            f"Settle digests these params as {summary['params_digest']}, this client as "
            f"{run.digest}: not dispatching"
        )
    state = _field(summary, "state", str, "register")
    opened = summary.get("approval")
    # A policy approved it as it opened: that request was this run's one dispatch, held
    # or refused; never sent again (resume says what happened).
    dispatch_sent = isinstance(opened, dict) and opened.get("status") == "approved"
    ran: EffectResult | None = None  # set once this call ran the effect
    held = summary.get("dispatch")
    if isinstance(held, dict):
        token = _field(held, "fencing_token", str, "register")
        lease = lease_seconds(held.get("lease_expires_at"))
        ran, outcome = yield from _execute(run, token, lease)
        if outcome is not None:
            return outcome
    if dispatch_sent:
        state = "dispatched" if ran is not None else "approved"  # resume decides
    deadline = time.monotonic() + run.settle_timeout
    while True:
        if state == "awaiting_approval":
            state = yield from _decision(run, opened if isinstance(opened, dict) else None)
            opened = None
            deadline = time.monotonic() + run.settle_timeout
            continue
        if state == "approved" and not dispatch_sent:
            dispatch_sent = True
            held = yield from _dispatch(run)
            if held is not None:
                lease = lease_seconds(held["lease_expires_at"])
                ran, outcome = yield from _execute(run, held["fencing_token"], lease)
                if outcome is not None:
                    return outcome
        answer = yield Call("POST", run.path("/resume"), {"worker": run.worker})
        decision = _field(answer, "decision", str, "resume")
        state = _field(answer, "state", str, "resume")
        if decision not in DECISIONS:
            raise errors.ProtocolError(f"resume answered an unknown decision: {answer}")
        if decision == "dispatch":
            token = _field(answer, "fencing_token", str, "resume")
            ran, outcome = yield from _execute(run, token, 0.0)
            if outcome is not None:
                return outcome
            continue
        if decision == "released":
            return _ended(run, state, bool(answer.get("recovered")), ran)
        if decision == "closed":
            if state != "failed":
                _closed(run, state)
            return _ended(run, state, bool(answer.get("recovered")), ran)
        if decision == "reconcile":
            raise errors.NeedsOperator(
                f"operation {run.key!r} needs an operator's decision (reconcile)",
                key=run.key,
                state=state,
                reason="reconcile",
            )
        if decision == "wait" and state == "awaiting_approval":
            continue
        # in_progress, unknown, or approved but not this worker's to run: ask again later.
        wait = float(answer.get("retry_after") or run.poll_interval)
        if time.monotonic() + wait > deadline:
            raise errors.NeedsOperator(
                f"operation {run.key!r} is still {state} ({decision}) after "
                f"{run.settle_timeout:g} s; its effect will not be run again",
                key=run.key,
                state=state,
                reason=decision,
            )
        yield Sleep(wait)


def _decision(run: Run, opened: dict[str, Any] | None = None) -> Generator[Step, Any, str]:
    """Open the approval (unless the registration ``opened`` it) and wait for its
    decision; the operation's state after it."""
    approval_id, rule, needed = "", "", ""
    try:
        if opened is None:
            opened = yield Call("POST", run.path("/approvals"), run.opening())
    except errors.InvalidState:
        pass  # decided meanwhile: the record says how
    else:
        assert opened is not None
        approval_id = _field(opened, "approval_id", str, "open approval")
        rule, needed = str(opened.get("rule") or ""), str(opened.get("needed") or "")
        if opened.get("status") in ("approved", "denied"):
            return str(opened["status"])  # a policy decided it as it opened
        if run.on_approval is not None:
            decided = run.on_approval(approval_id)
            # It decided itself (an Approver's Decided): no need to ask how it went.
            status = getattr(decided, "status", None)
            if status in ("approved", "denied"):
                return str(status)
    waited_until = time.monotonic() + run.approval_timeout
    while True:
        # Held by the server until the decision (or ``wait`` seconds) where it can hold
        # it; a server that answers at once is read again after ``poll_interval``.
        wait = min(run.wait, int(waited_until - time.monotonic()))
        sent = time.monotonic()
        record = yield decision_read(run.key, wait)
        state = str(_field(record, "state", str, "operation"))
        if state != "awaiting_approval":
            return state
        if held_whole(sent, wait):
            continue
        remaining = waited_until - time.monotonic()
        if remaining <= 0:
            asked = f" (rule {rule!r}: {needed})" if rule else ""
            raise errors.ApprovalTimeout(
                f"operation {run.key!r} is still awaiting approval after "
                f"{run.approval_timeout:g} s{asked}",
                key=run.key,
                approval_id=approval_id,
                rule=rule,
                needed=needed,
            )
        yield Sleep(min(run.poll_interval, remaining))


def _dispatch(run: Run) -> Generator[Step, Any, dict[str, Any] | None]:
    """The dispatch's answer if this call won the permit; ``None``: resume decides."""
    try:
        held = yield Call(
            "POST",
            run.path("/dispatch"),
            {"worker": run.worker, "params_digest": run.digest},
            retry=False,
        )
    except (errors.PermitRefused, errors.StaleState, errors.TransportError):
        # Another worker won, the permit ended, or the answer was lost: never sent again.
        return None
    _field(held, "fencing_token", str, "dispatch")
    return dict(held)


def _execute(
    run: Run, token: str, lease: float
) -> Generator[Step, Any, tuple[EffectResult, Outcome | None]]:
    """Run the effect under the dispatch and report it; no outcome: resume must settle it."""
    result: EffectResult = yield Effect(token, lease)
    body: dict[str, Any] = {"fencing_token": token, "outcome": "committed"}
    if result.error is not None:
        body["outcome"] = "failed"
    else:
        if result.reference:
            body["provider_reference"] = result.reference
        if result.result is not None:
            body["result"] = result.result
    try:
        reported = yield Call("POST", run.path("/result"), body)
    except (errors.FencingError, errors.StaleState, errors.TransportError):
        return result, None  # the lease lapsed or the answer was lost: evidence settles it
    state = _field(reported, "state", str, "result")
    if state not in ("released", "failed"):
        return result, None
    return result, _ended(run, state, False, result)


def _ended(run: Run, state: str, recovered: bool, ran: EffectResult | None) -> Outcome:
    if ran is None:
        return Outcome(run.key, state, recovered)
    return Outcome(
        run.key, state, recovered, ran_effect=True, reference=ran.reference, error=ran.error
    )


def _closed(run: Run, state: str) -> None:
    kinds: dict[str, type[errors.OperationClosed]] = {
        "denied": errors.ApprovalDenied,
        "expired": errors.ApprovalExpired,
        "revoked": errors.OperationRevoked,
        "voided": errors.OperationVoided,
    }
    raise kinds.get(state, errors.OperationClosed)(
        f"operation {run.key!r} is {state}; its effect was not run", key=run.key, state=state
    )
