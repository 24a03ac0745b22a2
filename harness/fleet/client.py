"""A fleet client: its calls to each endpoint, the steps its roles share, and its record.

What a client records (its keys, the fencing tokens each was handed, the resumes'
decisions, a second effect at a provider) is what ``harness.fleet.run`` collects.
"""

from __future__ import annotations

import functools
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness import providers
from harness.fleet.api import Answer, Api

PARAMS = {"amount": 1250, "currency": "EUR", "to": "acct-7", "memo": "fleet"}
OTHER_PARAMS = {**PARAMS, "amount": 9999}
# A resumer's poll while its operation is in_progress: retry_after, capped (a live 60 s
# lease need not be waited out here), at most this many times.
RESUME_WAIT = 1.0
RESUME_POLLS = 12


@dataclass
class Provider:
    """A provider as a client sees it: where to perform effects, and its lease."""

    name: str
    kind: str
    lease_seconds: int = 60
    path: str = ""  # sqlite, journal
    url: str = ""  # http
    secret: str = ""  # http: signs callbacks

    @property
    def short_lease(self) -> bool:
        return self.lease_seconds <= 2


@dataclass
class Client:
    """One fleet client: its API, its record of keys, tokens and violations."""

    api: Api
    name: str
    index: int
    providers: list[Provider]
    shared_dir: Path | None
    deadline: float = 0.0
    t0: float = 0.0
    lifecycles: int = 0
    requests: int = 0  # HTTP requests of a whole-lifecycle role (httpx, sockets, library)
    tokens: Counter[str] = field(default_factory=Counter)
    keys: dict[str, dict[str, str]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    resumes: Counter[str] = field(default_factory=Counter)  # decision: answers
    later: list[tuple[float, str, Any]] = field(default_factory=list)
    cpu_started: float = 0.0  # process_time() when the role's loop began

    # endpoints ---------------------------------------------------------------------

    def register(
        self, key: str, provider: Provider, expect: Iterable[str] = ("201",), params: Any = None
    ) -> Answer:
        self.keys.setdefault(key, {"provider": provider.name, "intent": "aborted"})
        body = {
            "key": key,
            "action": "payment.send",
            "provider": provider.name,
            "params": PARAMS if params is None else params,
        }
        send = self.api.post("/api/v1/operations", body)
        return self.api.call("register", send, expect=expect, key=key)

    def open_approval(self, key: str, expect: Iterable[str] = ("201",)) -> Answer:
        send = self.api.post(f"/api/v1/operations/{key}/approvals", {})
        return self.api.call("open approval", send, expect=expect, key=key)

    def approve(self, key: str, approval_id: str, expect: Iterable[str] = ("200",)) -> Answer:
        # The approver's app shows the action and names the digest it showed.
        digest = providers.digest_of(PARAMS)
        return self.api.call(
            "approve",
            lambda: asdict(self.api.approver.approve_digest(approval_id, params_digest=digest)),
            expect=expect,
            key=key,
        )

    def dispatch(self, key: str, expect: Iterable[str] = ("200",)) -> str:
        """The fencing token handed out, or ""."""
        send = self.api.post(
            f"/api/v1/operations/{key}/dispatch",
            {"worker": self.name, "params_digest": providers.digest_of(PARAMS)},
        )
        answer = self.api.call("dispatch", send, expect=expect, key=key)
        token = answer.body.get("fencing_token", "") if answer.ok else ""
        if token:
            self.tokens[key] += 1
        return str(token)

    def resume(self, key: str, decisions: Iterable[str]) -> tuple[str, str, float]:
        """``(decision, fencing token or "", retry_after or 0)``.

        A decision not in ``decisions`` is unexpected, and so is ``in_progress`` without
        ``retry_after`` (a live lease, or a lookup queued or running, always says when to
        ask again).
        """
        send = self.api.post(f"/api/v1/operations/{key}/resume", {"worker": self.name})
        answer = self.api.call("resume", send, expect=("200",), key=key)
        if not answer.ok:
            return "", "", 0.0
        decision, token = (
            str(answer.body.get("decision")),
            str(answer.body.get("fencing_token", "")),
        )
        retry_after = float(answer.body.get("retry_after") or 0)
        self.resumes[decision] += 1
        if token:
            self.tokens[key] += 1
        if (
            decision not in set(decisions)
            or bool(token) != (decision == "dispatch")
            or (decision == "in_progress" and retry_after < 1)
        ):
            self.api.unexpected.append(
                {
                    "endpoint": "resume",
                    "key": key,
                    "outcome": f"200 decision {decision}",
                    "expected": sorted(decisions),
                    "body": answer.body,
                }
            )
        return decision, token, retry_after

    def resume_polled(
        self,
        key: str,
        decisions: Iterable[str],
        then: Callable[[str], None],
        polls: int = RESUME_POLLS,
    ) -> None:
        """Resume ``key``; while ``in_progress``, ask again after ``retry_after`` (deferred,
        see ``run_due``), ``polls`` times at most; then ``then(last decision)``.

        A decision still ``in_progress`` after the last poll is unexpected: nothing ran
        the lookup that resume queued, or the lease never ended.
        """
        decisions = tuple(decisions)
        decision, _, retry_after = self.resume(key, decisions)
        if decision == "in_progress" and polls > 1:
            wait = min(max(retry_after, 0.1), RESUME_WAIT)
            self.later.append(
                (
                    time.monotonic() + wait,
                    key,
                    lambda: self.resume_polled(key, decisions, then, polls - 1),
                )
            )
            return
        if decision == "in_progress":
            self.api.unexpected.append(
                {
                    "endpoint": "resume",
                    "key": key,
                    "outcome": f"still in_progress after {RESUME_POLLS} polls",
                    "at": time.time(),
                }
            )
        then(decision)

    def heartbeat(self, key: str, token: str, expect: Iterable[str] = ("200",)) -> Answer:
        send = self.api.post(f"/api/v1/operations/{key}/heartbeat", {"fencing_token": token})
        return self.api.call("heartbeat", send, expect=expect, key=key)

    def report(
        self, key: str, token: str, outcome: str = "committed", expect: Iterable[str] = ("200",)
    ) -> Answer:
        send = self.api.post(
            f"/api/v1/operations/{key}/result",
            {"fencing_token": token, "outcome": outcome, "provider_reference": f"ref-{key}"},
        )
        return self.api.call(f"report {outcome}", send, expect=expect, key=key)

    def revoke(self, key: str, permit_id: str) -> Answer:
        send = self.api.post(
            f"/api/v1/permits/{permit_id}/revoke", {"reason": f"{self.name} changed its mind"}
        )
        return self.api.call("revoke", send, expect=("200",), key=key)

    def record(self, key: str) -> dict[str, Any]:
        send = functools.partial(self.api.host.operation, key)
        answer = self.api.call("record", send, expect=("200",), key=key)
        return answer.body if answer.ok else {}

    def callback(
        self,
        key: str,
        provider: Provider,
        payload: dict[str, Any],
        expect: Iterable[str] = ("200",),
        secret: str = "",
    ) -> Answer:
        callbacks = self.api.callbacks(provider.name, secret or provider.secret)
        send = functools.partial(callbacks.notify, **payload)
        return self.api.call("callback", send, expect=expect, key=key)

    # steps -------------------------------------------------------------------------

    def approved(self, key: str, provider: Provider) -> str:
        """Register, open and approve a fresh key; the permit id, or "" if a step failed."""
        if not self.register(key, provider).ok:
            return ""
        opened = self.open_approval(key)
        if not opened.ok:
            return ""
        if opened.body.get("status") == "approved":  # a policy approved it as it opened
            return str(opened.body.get("permit_id") or "")
        decided = self.approve(key, str(opened.body.get("approval_id")))
        return str(decided.body.get("permit_id") or "") if decided.ok else ""

    def registered_and_dispatched(self, key: str, provider: Provider) -> str:
        """Register, open the approval and dispatch in one request; where a person must
        approve, ``approve`` and ``dispatch`` after it. The fencing token, or ""."""
        self.keys.setdefault(key, {"provider": provider.name, "intent": "aborted"})
        send = self.api.post("/api/v1/operations", opening_body(key, provider, self.name))
        registered = self.api.call("register and open", send, expect=("201",), key=key)
        opened = registered.body.get("approval") if registered.ok else None
        if not isinstance(opened, dict):
            return ""
        held = registered.body.get("dispatch")
        if isinstance(held, dict):  # a policy approved it as it opened: dispatched too
            self.api.calls[-1][0] = "register, open and dispatch"
            self.tokens[key] += 1
            return str(held.get("fencing_token") or "")
        if opened.get("status") == "approved":
            return ""  # approved, but the dispatch was refused: not this lifecycle's
        decided = self.approve(key, str(opened.get("approval_id")))
        return self.dispatch(key) if decided.ok and decided.body.get("permit_id") else ""

    def perform(self, key: str, provider: Provider, status: str = "committed") -> int:
        """Perform the effect at the provider (as its outside tool does); the record's seq."""
        try:
            stored = providers.provider_perform(
                provider.kind,
                path=provider.path,
                url=provider.url,
                operation_key=key,
                params=PARAMS,
                reference=f"ref-{key}",
                status=status,
                replace=False,  # a second effect must fail, and be counted, not overwrite
            )
        except sqlite3.IntegrityError:
            self.violations.append(f"{key}: a second effect at {provider.name}")
            return 0
        return int(stored.get("seq", 0))

    def intend(self, key: str, intent: str) -> None:
        self.keys[key]["intent"] = intent

    def publish(self, key: str, provider: Provider) -> None:
        """Tell the resumer about a key left behind, and when its lease will have lapsed."""
        if self.shared_dir is not None:
            lapsed_at = time.time() + provider.lease_seconds + 0.5
            with open(self.shared_dir / f"{self.name}.keys", "a", encoding="utf-8") as handle:
                handle.write(f"{lapsed_at} {key}\n")

    def run_due(self, *, all_of_them: bool = False) -> None:
        """Run the deferred steps whose time has come (or all, at the end: also the steps
        they defer in turn, which are bounded retries)."""
        while self.later:
            now = time.monotonic()
            due = [item for item in self.later if all_of_them or item[0] <= now]
            self.later = [item for item in self.later if item not in due]
            for at, _, step in sorted(due, key=lambda item: item[0]):
                delay = at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                step()
            if not all_of_them:
                return


def opening_body(key: str, provider: Provider, worker: str) -> dict[str, Any]:
    """The lifecycle's first request: register ``key``, open its approval and, where a
    policy approves it as it opens, dispatch it to ``worker``."""
    return {
        "key": key,
        "action": "payment.send",
        "provider": provider.name,
        "params": PARAMS,
        "approval": {},
        "dispatch": {"worker": worker, "params_digest": providers.digest_of(PARAMS)},
    }


def iterations(client: Client) -> Iterable[int]:
    # The loop's CPU is counted from here: a role's set-up (an httpx client builds its
    # TLS context) is paid once per process, not per request.
    client.cpu_started = time.process_time()
    i = 0
    while time.time() < client.deadline:
        yield i
        i += 1
