"""The fleet's roles: what each kind of client does, in a loop until its deadline.

``ROLES`` names them for ``--role``; the package docstring (``harness.fleet``) says what
each one drives and expects.
"""

from __future__ import annotations

import contextlib
import functools
import time
from pathlib import Path

from harness import providers
from harness.fleet.baselines import role_httpx, role_lifecycle_sockets, role_sockets
from harness.fleet.client import OTHER_PARAMS, PARAMS, Client, Provider, iterations

RACE_SLOT_SECONDS = 0.4


def role_lifecycle(client: Client) -> None:
    provider = client.providers[0]
    for i in iterations(client):
        key = f"{client.name}-{i}"
        token = client.registered_and_dispatched(key, provider)
        if token and client.report(key, token).ok:
            client.lifecycles += 1


def role_library(client: Client) -> None:
    """``lifecycle`` through ``settle_client.Host.run``: the benchmark's library loop.

    The same five requests as ``lifecycle`` (register, open approval, approve with the
    digest, dispatch, report committed), made by the library over ``httpx``; the effect
    does nothing, as there. Each run is one ``calls`` entry (``library run``); the HTTP
    requests it made are counted in ``requests``.
    """
    import httpx
    import settle_client

    class Counting(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            client.requests += 1
            return super().handle_request(request)

    url = client.api.url
    transport = Counting()
    host = settle_client.Host(
        url, client.api.tokens["host"], worker=client.name, transport=transport
    )
    approver = settle_client.Approver(url, client.api.tokens["approver"], transport=transport)
    digest = settle_client.params_digest(PARAMS)
    provider = client.providers[0]
    for i in iterations(client):
        key = f"{client.name}-{i}"
        started = time.perf_counter()
        try:
            outcome = host.run(
                key,
                action="payment.send",
                provider=provider.name,
                params=PARAMS,
                effect=lambda token: None,
                on_approval=lambda approval: approver.approve_digest(
                    approval, params_digest=digest
                ),
            )
        except settle_client.SettleError as exc:
            client.api.unexpected.append(
                {"endpoint": "library run", "key": key, "error": repr(exc)}
            )
            continue
        elapsed_ms = (time.perf_counter() - started) * 1000
        client.api.calls.append(["library run", 200, "", elapsed_ms, None, None])
        if outcome.released and outcome.ran_effect:
            client.lifecycles += 1
        else:
            client.api.unexpected.append(
                {"endpoint": "library run", "key": key, "outcome": str(outcome)}
            )


def role_steady(client: Client) -> None:
    for i in iterations(client):
        provider = client.providers[i % len(client.providers)]
        key = f"{client.name}-{i}"
        variant = (i // len(client.providers)) % 6
        permit_id = client.approved(key, provider)
        if not permit_id:
            continue
        if variant == 4:  # revoked before dispatch: nothing may run it any more
            revoked = client.revoke(key, permit_id)
            client.api.check(revoked, "revoke", key, revoked=True)
            if revoked.ok and revoked.body.get("revoked") is True:
                client.dispatch(key, expect=("409:revoked",))
                decision, _, _ = client.resume(key, decisions=("closed",))
                if decision == "closed":
                    client.intend(key, "revoked")
            continue
        token = client.dispatch(key)
        if not token:
            continue
        if variant == 5:  # revoked after dispatch: the consumed permit stays consumed
            revoked = client.revoke(key, permit_id)
            client.api.check(revoked, "revoke", key, revoked=False, status="consumed")
        lost = ("200", "409:lease_lost") if provider.short_lease else ("200",)
        if variant == 3:
            client.heartbeat(key, token, expect=lost)
            report = client.report(key, token, "failed")
            settled = {} if provider.short_lease else {"state": "failed"}
            client.api.check(report, "report failed", key, applied=True, **settled)
            if report.ok:
                client.intend(key, "failed_short_lease" if provider.short_lease else "failed")
            continue
        client.perform(key, provider)
        client.heartbeat(key, token, expect=lost)
        report = client.report(key, token)
        settled = {} if provider.short_lease else {"state": "released"}
        client.api.check(report, "report committed", key, applied=True, **settled)
        if report.ok:
            client.intend(key, "committed")
            client.lifecycles += 1


def role_racer(client: Client) -> None:
    provider = client.providers[0]
    number = -1
    while time.time() < client.deadline:
        number = max(number + 1, int((time.time() - client.t0) / RACE_SLOT_SECONDS))
        _race(client, provider, f"race-{number}", number)


def _race(client: Client, provider: Provider, key: str, number: int) -> None:
    if not client.register(key, provider, expect=("200", "201")).ok:
        return
    opened = client.open_approval(key, expect=("200", "201", "409:invalid_state"))
    permit_id = ""
    if opened.ok:
        decided = client.approve(
            key, str(opened.body.get("approval_id")), expect=("200", "409:already_decided")
        )
        if not (decided.ok or decided.code == "already_decided"):
            return
        permit_id = str(decided.body.get("permit_id") or "")
    elif opened.code != "invalid_state":
        return
    if client.index == 0 and number % 5 == 0:
        permit_id = permit_id or str((client.record(key).get("permit") or {}).get("permit_id", ""))
        if permit_id:
            client.revoke(key, permit_id)
    if (number + client.index) % 2 == 0:
        token = client.dispatch(key, expect=("200", "409:already_consumed", "409:revoked"))
    else:
        _, token, _ = client.resume(
            key, decisions=("dispatch", "in_progress", "released", "closed")
        )
    if not token:
        if client.index == 1 and number % 3 == 0:  # a loser presenting a forged token
            forged = "forged-" + client.name
            client.report(key, forged, expect=("409:stale_fencing_token",))
            client.heartbeat(key, forged, expect=("409:stale_fencing_token",))
        return
    client.perform(key, provider)
    client.heartbeat(key, token)
    report = client.report(key, token)
    client.api.check(report, "report committed", key, applied=True, state="released")
    if report.ok:
        client.intend(key, "committed")


def role_crasher(client: Client) -> None:
    provider = client.providers[0]
    wait = provider.lease_seconds + 0.6
    for i in iterations(client):
        client.run_due()
        key = f"{client.name}-{i}"
        if not client.approved(key, provider):
            continue
        token = client.dispatch(key)
        if not token:
            continue
        variant = i % 4
        if variant == 1:  # crashed before performing the effect
            client.intend(key, "crash_before_effect")
            client.publish(key, provider)
            continue
        client.perform(key, provider)
        client.intend(key, "crash_after_effect")
        if variant == 0:
            client.publish(key, provider)
        elif variant == 2:  # the worker wakes up after its lease lapsed, and reports
            client.later.append(
                (time.monotonic() + wait, key, lambda k=key, t=token: _late(client, k, t))
            )
        else:  # a fresh worker resumes it once the lease has lapsed
            client.later.append(
                (
                    time.monotonic() + wait,
                    key,
                    lambda k=key: _fresh_worker(client, k),
                )
            )
    client.run_due(all_of_them=True)


def _fresh_worker(client: Client, key: str) -> None:
    """Resume a lapsed operation whose effect was performed: it must end released.

    The first answer is ``in_progress`` (resume moved it to ``unknown`` and queued a
    lookup), until the background worker's lookup found the matching evidence. Nothing
    else resumes this key, so no other lookup can have found anything else.
    """
    client.resume_polled(
        key, ("released", "in_progress"), then=functools.partial(_released, client, key)
    )


def _released(client: Client, key: str, decision: str) -> None:
    """Once released, a further resume answers the same: nothing is looked up again."""
    if decision == "released":
        client.resume(key, decisions=("released",))


def _late(client: Client, key: str, token: str) -> None:
    client.heartbeat(key, token, expect=("409:lease_lost",))
    client.report(key, token)


def role_callbacker(client: Client) -> None:
    provider = client.providers[0]
    digest = providers.digest_of(PARAMS)
    for i in iterations(client):
        key = f"{client.name}-{i}"
        if not client.approved(key, provider):
            continue
        token = client.dispatch(key)
        if not token:
            continue
        variant = i % 5
        status = "failed" if variant == 4 else "committed"
        seq = client.perform(key, provider, status=status)
        payload = {
            "operation_key": key,
            "status": status,
            "params_digest": digest,
            "reference": f"ref-{key}",
            "sequence": seq,
        }
        check = client.api.check
        if variant == 0:  # the worker crashed; the provider's callback settles it
            check(client.callback(key, provider, payload), "callback", key, state="released")
            client.intend(key, "committed")
        elif variant == 1:  # the worker's report first, then the provider's callback
            client.report(key, token)
            check(client.callback(key, provider, payload), "callback", key, state="released")
            client.intend(key, "committed")
        elif variant == 2:  # evidence for other params, then the real one, then a replay
            other = {**payload, "params_digest": providers.digest_of(OTHER_PARAMS)}
            mismatch = client.callback(key, provider, other)
            check(mismatch, "callback", key, applied=True, state="reconcile")
            newer = {**payload, "sequence": seq + 1}
            check(client.callback(key, provider, newer), "callback", key, state="released")
            replay = client.callback(key, provider, newer)
            check(replay, "callback", key, applied=False, reason="stale_sequence")
            client.intend(key, "committed")
        elif variant == 3:  # a forged callback, then the worker crashes
            client.callback(key, provider, payload, expect=("401:bad_signature",), secret="forged")
            client.intend(key, "crash_after_effect")
            client.publish(key, provider)
        else:  # the provider's own record says "not performed"
            failed = client.callback(key, provider, payload)
            check(failed, "callback", key, applied=True, state="failed")
            client.intend(key, "provider_failed")


def role_resumer(client: Client) -> None:
    """Poll each published key once its lease lapsed, many keys at once (deferred polls).

    A crash before the effect ends ``unknown`` (absent, the next lookup not due yet) or
    ``reconcile``; a crash after it, ``released``.
    """
    assert client.shared_dir is not None
    decisions = ("released", "unknown", "reconcile", "in_progress")
    resumed: set[str] = set()
    while time.time() < client.deadline:
        client.run_due()
        due = [
            key
            for lapsed_at, key in _published(client.shared_dir)
            if lapsed_at < time.time() and key not in resumed
        ]
        for key in due[:5]:
            resumed.add(key)
            client.resume_polled(key, decisions, then=functools.partial(_released, client, key))
        if not due:
            time.sleep(0.05)
    client.run_due(all_of_them=True)


def _published(directory: Path) -> list[tuple[float, str]]:
    found = []
    for path in sorted(directory.glob("*.keys")):
        for line in path.read_text("utf-8").splitlines():
            at, _, key = line.partition(" ")
            with contextlib.suppress(ValueError):
                found.append((float(at), key))
    return found


ROLES = {
    "lifecycle": role_lifecycle,
    "lifecycle-sockets": role_lifecycle_sockets,
    "httpx": role_httpx,
    "sockets": role_sockets,
    "library": role_library,
    "steady": role_steady,
    "racer": role_racer,
    "crasher": role_crasher,
    "callbacker": role_callbacker,
    "resumer": role_resumer,
}
