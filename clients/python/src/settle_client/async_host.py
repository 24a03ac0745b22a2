"""The asyncio host: ``AsyncHost`` and its context-manager form, ``AsyncAttempt``.

It drives the protocol of ``settle_client._protocol`` as ``Host`` does, awaiting instead
of blocking, with the heartbeat a task beside the effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from settle_client import errors
from settle_client._http import AsyncTransport
from settle_client._options import RETRY_HEARTBEAT_SECONDS, Lifecycle, _Options, _reference
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


class AsyncHost:
    """``Host`` for asyncio: ``await host.run(...)``, ``async with host.action(...)``.

    The effect may be a coroutine function, or a plain one (run in a thread, so the
    heartbeat keeps going).
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
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.options = _Options(
            worker=worker,
            timeout=timeout,
            approval_timeout=approval_timeout,
            settle_timeout=settle_timeout,
            poll_interval=poll_interval,
            heartbeat_interval=heartbeat_interval,
        )
        self.http = AsyncTransport(
            base_url, token, timeout=timeout, retries=retries, transport=transport
        )

    async def run(
        self,
        key: str,
        *,
        action: str,
        provider: str,
        params: dict[str, Any],
        effect: Callable[[str], Awaitable[Any]] | Callable[[str], Any],
        on_approval: Callable[[str], object] | None = None,
        party: dict[str, Any] | None = None,
    ) -> Outcome:
        """As ``Host.run``."""
        async with self.action(
            key,
            action=action,
            provider=provider,
            params=params,
            on_approval=on_approval,
            party=party,
        ) as attempt:
            if attempt.fencing_token is not None:
                try:
                    if inspect.iscoroutinefunction(effect):
                        value = await effect(attempt.fencing_token)
                    else:
                        value = await asyncio.to_thread(effect, attempt.fencing_token)
                        if inspect.isawaitable(value):
                            value = await value
                    attempt.reference = _reference(value)
                except Exception as exc:
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
    ) -> AsyncAttempt:
        """As ``Host.action``, with ``async with``."""
        spec = self.options.spec(key, action, provider, params, on_approval, party)
        return AsyncAttempt(self, lifecycle(spec), spec)

    async def operation(self, key: str) -> dict[str, Any]:
        return await self.http.call(Call("GET", operation_path(key)))

    async def approval(self, approval_id: str) -> dict[str, Any]:
        """The approval this host opened: the exact action, its status, and where it is
        addressed to the customer, ``party`` and (while pending) ``link`` and
        ``expires_at``: the link to deliver to them."""
        return await self.http.call(Call("GET", f"/api/v1/approvals/{quote(approval_id, safe='')}"))

    async def party(self, party: str) -> dict[str, Any]:
        """As ``Host.party``."""
        return await self.http.call(party_read(party))

    async def party_enrolment(
        self, party: str, *, name: str = "", contact: str = ""
    ) -> dict[str, Any]:
        """As ``Host.party_enrolment``."""
        return await self.http.call(party_enrolment(party, name, contact))

    async def party_passkey_remove(self, party: str, passkey_id: int) -> dict[str, Any]:
        """As ``Host.party_passkey_remove``."""
        return await self.http.call(party_passkey_removal(party, passkey_id))

    async def operation_history(self, key: str) -> list[dict[str, Any]]:
        """As ``Host.operation_history``."""
        lines: list[dict[str, Any]] = []
        path: str | None = operation_path(key, "/history")
        while path:
            page = await self.http.call(Call("GET", path))
            lines += page["lines"]
            path = page["next"]
        return lines

    async def drive(self, steps: Lifecycle, value: Any = None) -> Effect | Outcome:
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
                await asyncio.sleep(step.seconds)
                continue
            try:
                value = await self.http.call(step)
            except errors.SettleError as exc:
                failure = exc

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncHost:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class AsyncAttempt:
    """One ``AsyncHost.run`` in the context-manager form."""

    def __init__(self, host: AsyncHost, steps: Lifecycle, spec: Run) -> None:
        self.host = host
        self.steps = steps
        self.spec = spec
        self.fencing_token: str | None = None
        self.reference: str | None = None
        # What the effect returned, a JSON object reported with it (the receipt keeps it).
        self.result: dict[str, Any] | None = None
        # Set when the effect's outcome is not known here (its answer was lost): nothing is
        # reported, the lease lapses and the provider's evidence settles it.
        self.unknown = False
        self.error: BaseException | None = None
        self.outcome: Outcome | None = None
        self._heartbeat: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AsyncAttempt:
        step = await self.host.drive(self.steps)
        if isinstance(step, Outcome):
            self.outcome = step
            return self
        self.fencing_token = step.fencing_token
        self._heartbeat = asyncio.create_task(self._beat(step))
        return self

    async def _beat(self, effect: Effect) -> None:
        call = Call("POST", self.spec.path("/heartbeat"), {"fencing_token": effect.fencing_token})
        options = self.host.options
        wait = options.beat_after(effect.lease_seconds) if effect.lease_seconds else 0.0
        while True:
            await asyncio.sleep(wait)
            try:
                answer = await self.host.http.call(call)
            except errors.FencingError:
                return
            except errors.SettleError:
                wait = RETRY_HEARTBEAT_SECONDS
                continue
            wait = options.beat_after(lease_seconds(answer.get("lease_expires_at")))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._heartbeat is None:
            return
        self._heartbeat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._heartbeat
        if self.unknown or isinstance(exc, KeyboardInterrupt | SystemExit | asyncio.CancelledError):
            return
        error = exc if exc is not None else self.error
        step = await self.host.drive(self.steps, EffectResult(self.reference, error, self.result))
        if isinstance(step, Effect):
            raise errors.ProtocolError("Settle handed out a second dispatch")
        self.outcome = step
