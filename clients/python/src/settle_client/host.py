"""Hosts: run an action crash-safely, blocking (``Host``) or with asyncio (``AsyncHost``).

Both drive the one protocol in ``settle_client._protocol``; they differ only in how they
wait, call and heartbeat (a thread, or a task, while the effect runs). This module holds
the blocking ``Host``, its ``Attempt`` and heartbeat threads; ``AsyncHost`` is in
``settle_client.async_host`` and importable from here too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from settle_client import errors
from settle_client._http import SyncTransport
from settle_client._options import RETRY_HEARTBEAT_SECONDS, Lifecycle, _Options, _reference
from settle_client._options import default_worker as default_worker
from settle_client._protocol import (
    Call,
    Effect,
    EffectResult,
    Outcome,
    Run,
    Sleep,
    lease_seconds,
    lifecycle,
    operation_path,
    party_enrolment,
    party_passkey_removal,
    party_read,
)
from settle_client.async_host import AsyncAttempt as AsyncAttempt
from settle_client.async_host import AsyncHost as AsyncHost

# How long a Host's heartbeat watch thread outlives the last dispatch it held.
WATCH_IDLE_SECONDS = 60.0


class Host:
    """A host's connection to Settle, with its token; reuse one for many runs.

    ``approval_timeout`` bounds the wait for an approver's decision; ``settle_timeout``
    the wait for an operation another worker holds or a lookup is settling;
    ``heartbeat_interval`` defaults to a third of the lease.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        worker: str | None = None,
        timeout: float = 30.0,
        retries: int = 3,
        approval_timeout: float = 300.0,
        settle_timeout: float = 120.0,
        poll_interval: float = 0.5,
        heartbeat_interval: float | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.options = _Options(
            worker=worker,
            timeout=timeout,
            approval_timeout=approval_timeout,
            settle_timeout=settle_timeout,
            poll_interval=poll_interval,
            heartbeat_interval=heartbeat_interval,
        )
        self.http = SyncTransport(
            base_url, token, timeout=timeout, retries=retries, transport=transport
        )
        self.watch = _Watch()

    def run(
        self,
        key: str,
        *,
        action: str,
        provider: str,
        params: dict[str, Any],
        effect: Callable[[str], Any],
        on_approval: Callable[[str], object] | None = None,
        party: dict[str, Any] | None = None,
    ) -> Outcome:
        """Run ``effect(fencing_token)`` at most once ever for ``key``; how it ended.

        The effect returns the provider's reference (or ``None``), or raises: the run is
        reported ``failed`` and the exception is the outcome's ``error``. Run again after
        a crash, the effect is not called again: the outcome is what Settle settled.
        """
        with self.action(
            key,
            action=action,
            provider=provider,
            params=params,
            on_approval=on_approval,
            party=party,
        ) as attempt:
            if attempt.fencing_token is not None:
                try:
                    attempt.reference = _reference(effect(attempt.fencing_token))
                except Exception as exc:  # reported as failed; the outcome carries it
                    attempt.error = exc
        assert attempt.outcome is not None
        return attempt.outcome

    def action(
        self,
        key: str,
        *,
        action: str,
        provider: str,
        params: dict[str, Any],
        on_approval: Callable[[str], object] | None = None,
        party: dict[str, Any] | None = None,
    ) -> Attempt:
        """The context-manager form of ``run``: the body is the effect.

        ``attempt.fencing_token`` is ``None`` when the effect must not run here (it ran
        before, or the operation is settled); set ``attempt.reference`` in the body. An
        exception leaving the body is reported ``failed`` and raised again.
        """
        spec = self.options.spec(key, action, provider, params, on_approval, party)
        return Attempt(self, lifecycle(spec), spec)

    def operation(self, key: str) -> dict[str, Any]:
        """The whole record of operation ``key`` (permit, dispatch, receipt, evidence).

        Its permit's history is the first page (``history_next``: the rest, if any).
        """
        return self.http.call(Call("GET", operation_path(key)))

    def approval(self, approval_id: str) -> dict[str, Any]:
        """The approval this host opened: the exact action, its status, and where it is
        addressed to the customer, ``party`` and (while pending) ``link`` and
        ``expires_at``: the link to deliver to them."""
        return self.http.call(Call("GET", f"/api/v1/approvals/{quote(approval_id, safe='')}"))

    def party(self, party: str) -> dict[str, Any]:
        """This host's customer ``party``: ``display_name`` and every passkey enrolled
        for them (``removed_at`` null while it may sign)."""
        return self.http.call(party_read(party))

    def party_enrolment(self, party: str, *, name: str = "", contact: str = "") -> dict[str, Any]:
        """A one-time link (``url``, ``expires_at``) at which the customer enrols a passkey
        on their phone: deliver it inside your signed-in app, which vouches for them."""
        return self.http.call(party_enrolment(party, name, contact))

    def party_passkey_remove(self, party: str, passkey_id: int) -> dict[str, Any]:
        """Revoke one of the customer's passkeys: it signs nothing from now on."""
        return self.http.call(party_passkey_removal(party, passkey_id))

    def operation_history(self, key: str) -> list[dict[str, Any]]:
        """Every line of the history of operation ``key``'s newest permit, oldest first,
        read page by page."""
        lines: list[dict[str, Any]] = []
        path: str | None = operation_path(key, "/history")
        while path:
            page = self.http.call(Call("GET", path))
            lines += page["lines"]
            path = page["next"]
        return lines

    def drive(self, steps: Lifecycle, value: Any = None) -> Effect | Outcome:
        """Advance the protocol until it asks for the effect or ends."""
        failure: errors.SettleError | None = None
        while True:
            try:
                step = steps.send(value) if failure is None else steps.throw(failure)
            except StopIteration as stop:
                outcome: Outcome = stop.value
                return outcome
            value, failure = None, None
            if isinstance(step, Effect):
                return step
            if isinstance(step, Sleep):
                time.sleep(step.seconds)
                continue
            try:
                value = self.http.call(step)
            except errors.SettleError as exc:
                failure = exc

    def close(self) -> None:
        self.watch.close()
        self.http.close()

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Attempt:
    """One ``run`` in the context-manager form (``Host.action``)."""

    def __init__(self, host: Host, steps: Lifecycle, spec: Run) -> None:
        self.host = host
        self.steps = steps
        self.spec = spec
        self.fencing_token: str | None = None
        self.reference: str | None = None
        # What the effect returned, a JSON object reported with it (the receipt keeps it).
        self.result: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.outcome: Outcome | None = None
        self._heartbeat: _Heartbeat | None = None

    def __enter__(self) -> Attempt:
        step = self.host.drive(self.steps)
        if isinstance(step, Outcome):
            self.outcome = step
            return self
        self.fencing_token = step.fencing_token
        self._heartbeat = _Heartbeat(self.host, self.spec, step)
        self.host.watch.add(self._heartbeat)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._heartbeat is None:
            return
        self._heartbeat.stop()
        error = exc if exc is not None else self.error
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            return  # leave the dispatch as a crash would: resume settles it
        step = self.host.drive(self.steps, EffectResult(self.reference, error, self.result))
        if isinstance(step, Effect):
            raise errors.ProtocolError("Settle handed out a second dispatch")
        self.outcome = step


class _Heartbeat(threading.Thread):
    """Extends the lease while the effect runs; stops when told or when the lease is lost.

    Started by ``_Watch`` only once the effect has run until its first heartbeat is due:
    most effects end well before a third of the lease, and then no thread is started.
    """

    def __init__(self, host: Host, spec: Run, effect: Effect) -> None:
        super().__init__(name=f"settle-heartbeat-{spec.key}", daemon=True)
        self.host = host
        self.call = Call("POST", spec.path("/heartbeat"), {"fencing_token": effect.fencing_token})
        self.lease = effect.lease_seconds
        self.stopped = threading.Event()
        self.lost: errors.SettleError | None = None

    def first_beat_after(self) -> float:
        """Seconds from the dispatch to the first heartbeat (0: the lease is not known)."""
        return self.host.options.beat_after(self.lease) if self.lease else 0.0

    def run(self) -> None:
        wait = 0.0  # the first one is due when the thread starts
        while not self.stopped.wait(wait):
            try:
                answer = self.host.http.call(self.call)
            except errors.FencingError as exc:
                self.lost = exc  # the report will be refused too; resume settles it
                return
            except errors.SettleError:
                wait = RETRY_HEARTBEAT_SECONDS
                continue
            wait = self.host.options.beat_after(lease_seconds(answer.get("lease_expires_at")))

    def stop(self) -> None:
        """Stop it; once this returns, no heartbeat request of this run is in flight."""
        self.host.watch.forget(self)
        self.stopped.set()
        if self.ident is not None:
            self.join()


class _Watch:
    """One per ``Host``: starts a run's heartbeat thread when its first beat is due.

    Holding a dispatch costs a dictionary entry, not a thread; the heartbeat's own
    requests still run in a thread per run, so one slow heartbeat never delays another
    run's. Its thread starts with a dispatch and ends after ``WATCH_IDLE_SECONDS`` with
    none held, so a ``Host`` nobody closes leaves no thread behind for long.
    """

    def __init__(self) -> None:
        self.due: dict[_Heartbeat, float] = {}
        self.changed = threading.Condition()
        self.thread: threading.Thread | None = None
        self.closed = False
        self.wakes_at = 0.0  # when the thread wakes next, unless notified

    def add(self, beat: _Heartbeat) -> None:
        first = beat.first_beat_after()
        if first <= 0:
            beat.start()
            return
        at = time.monotonic() + first
        with self.changed:
            self.due[beat] = at
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._run, name="settle-heartbeat-watch", daemon=True
                )
                self.thread.start()
            elif at < self.wakes_at:
                self.changed.notify()  # else it wakes in time anyway: no thread switch

    def forget(self, beat: _Heartbeat) -> None:
        with self.changed:
            self.due.pop(beat, None)

    def close(self) -> None:
        with self.changed:
            self.closed = True
            self.changed.notify()

    def _run(self) -> None:
        idle_since: float | None = None
        with self.changed:
            while not self.closed:
                now = time.monotonic()
                for beat in [beat for beat, at in self.due.items() if at <= now]:
                    del self.due[beat]
                    beat.start()  # under the lock: ``forget`` then ``stop`` sees it started
                if self.due:
                    idle_since = None
                    self.wakes_at = min(self.due.values())
                elif idle_since is None:
                    idle_since = now
                    self.wakes_at = now + WATCH_IDLE_SECONDS
                elif now >= idle_since + WATCH_IDLE_SECONDS:
                    break
                self.changed.wait(max(0.0, self.wakes_at - now))
            self.thread = None
