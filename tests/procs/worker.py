"""A crash-test worker: a separate OS process that drives one operation like a real host.

Run by the integration tests as ``python tests/procs/worker.py ...`` with the host token in
the ``SETTLE_HOST_TOKEN`` environment variable. It talks to Settle only through the host
HTTP API (standard library ``urllib``) and performs effects at the provider with the
"outside tools" in ``harness/providers.py`` (which need no Django).

Every step is printed as one JSON line on stdout (flushed), so the parent can wait for a
precise point -- ``ready``, ``request``, ``answer``, ``effect_committed``, ``holding`` --
and SIGKILL the process there. ``holding`` means "I hold the dispatch and now sleep"
(bounded by ``--hold-seconds``, so a test that forgets to kill leaves no orphan).

With ``--poll-seconds`` a resuming worker polls as a host does: while the answer is
``in_progress`` it waits the ``retry_after`` it was given and asks again (an ``answer``
line each time), then prints ``settled`` with the last answer; it gives up (``timeout``)
once ``--poll-seconds`` have passed.

Why this worker speaks HTTP by hand and not through ``settle_client`` (whose own crash
tests run ``tests/procs/host_run.py``, ``Host.run`` killed at each point): its tests test
the server's answers, one request at a time. ``--mode dispatch`` sends exactly one
dispatch, so fifty racers get fifty answers to judge (the library would resume after a
refusal); ``--mode resume`` stops at the first answer that is not ``in_progress`` (an
``unknown`` with its ``retry_after``, counted against the lookup budget one resume at a
time), where the library asks again until ``settle_timeout``; and every answer's shape is
checked here more strictly than a host needs to (``Malformed``).

Exit codes: 0 a well-formed answer was received (whatever its HTTP status: the parent
judges the status); 2 transport error or malformed answer; 3 a barrier/gate or the poll
timed out; 4 held for ``--hold-seconds`` without being killed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from harness.processes import emit, wait_for_file  # noqa: E402

DECISIONS = {"wait", "dispatch", "in_progress", "released", "unknown", "reconcile", "closed"}

# A local live server: never through a proxy from the environment.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Malformed(Exception):
    """The API answered something that is not a well-formed answer."""


def post(base_url: str, token: str, path: str, body: dict[str, Any], timeout: float) -> Any:
    """POST JSON; return ``(status, body)``. HTTP errors are answers, not exceptions."""
    request = urllib.request.Request(
        base_url.rstrip("/") + path,
        data=json.dumps(body).encode("utf-8"),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {token}",
            "Connection": "close",
        },
    )
    try:
        with _DIRECT.open(request, timeout=timeout) as response:
            status, raw = int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        status, raw = int(exc.code), exc.read()
        exc.close()
    try:
        payload = json.loads(raw)
    except ValueError as exc:
        raise Malformed(f"HTTP {status} with a body that is not JSON: {raw[:200]!r}") from exc
    if not isinstance(payload, dict):
        raise Malformed(f"HTTP {status} with a JSON body that is not an object")
    if not 200 <= status < 300 and not isinstance(payload.get("error"), str):
        raise Malformed(f"HTTP {status} without an error code: {payload}")
    return status, payload


def check_answer(mode: str, status: int, body: dict[str, Any]) -> str:
    """The fencing token the answer grants ("" if none); Malformed if it is not an answer."""
    if status != 200:
        return ""
    if mode == "dispatch":
        token = body.get("fencing_token")
        if not isinstance(token, str) or not token or not isinstance(body.get("permit_id"), str):
            raise Malformed(f"dispatch answered 200 without a fencing token: {body}")
        return token
    decision = body.get("decision")
    if decision not in DECISIONS or not isinstance(body.get("state"), str):
        raise Malformed(f"resume answered 200 without a known decision: {body}")
    if not isinstance(body.get("recovered"), bool):
        raise Malformed(f"resume answered 200 without 'recovered': {body}")
    retry_after = body.get("retry_after")
    if retry_after is not None and (type(retry_after) is not int or retry_after < 1):
        raise Malformed(f"resume answered a retry_after that is not a positive integer: {body}")
    if decision == "in_progress" and retry_after is None:
        raise Malformed(f"resume answered in_progress without retry_after: {body}")
    token = body.get("fencing_token", "")
    if decision == "dispatch":
        if not isinstance(token, str) or not token:
            raise Malformed(f"resume decided dispatch without a fencing token: {body}")
        return token
    if token:
        raise Malformed(f"resume decided {decision} but handed out a fencing token: {body}")
    return ""


def perform_effect(args: argparse.Namespace, digest: str) -> dict[str, Any]:
    """Perform the effect at the provider, as the outside tool of that provider does."""
    from harness import providers

    reference = args.reference or f"ref-{args.key}"
    stored = providers.provider_perform(
        args.effect,
        path=args.provider_path or "",
        url=args.provider_url or "",
        operation_key=args.key,
        params=json.loads(args.params),
        reference=reference,
        params_digest=digest,
        corrupt_checksum=args.corrupt_checksum,
    )
    return {"reference": reference, **stored}


def hold(stage: str, seconds: float) -> None:
    emit("holding", stage=stage)
    time.sleep(seconds)
    emit("hold_expired", stage=stage)
    sys.exit(4)


def params_digest(args: argparse.Namespace) -> str:
    if args.digest:
        return str(args.digest)
    from harness.providers import digest_of

    return digest_of(json.loads(args.params))


def run(args: argparse.Namespace, token: str) -> int:
    if args.go_file:
        emit("ready")
        wait_for_file(args.go_file, args.gate_timeout, "go")
    digest = params_digest(args)
    if args.mode == "resume":
        path, body = f"/api/v1/operations/{args.key}/resume", {"worker": args.worker}
    else:
        path = f"/api/v1/operations/{args.key}/dispatch"
        body = {"worker": args.worker, "params_digest": digest}
    emit("request", mode=args.mode, at=time.time())
    status, answer = post(args.url, token, path, body, args.timeout)
    fencing_token = check_answer(args.mode, status, answer)
    emit("answer", mode=args.mode, status=status, body=answer, at=time.time())
    if args.poll_seconds:
        deadline = time.monotonic() + args.poll_seconds
        while status == 200 and answer["decision"] == "in_progress":
            if time.monotonic() + answer["retry_after"] > deadline:
                emit("timeout", waiting_for="settled")
                sys.exit(3)
            time.sleep(answer["retry_after"])
            status, answer = post(args.url, token, path, body, args.timeout)
            fencing_token = check_answer(args.mode, status, answer)
            emit("answer", mode=args.mode, status=status, body=answer, at=time.time())
        emit("settled", status=status, body=answer)
    if not fencing_token or args.effect == "none":
        emit("done")
        return 0

    # This worker holds the one dispatch.
    if args.crash_point == "before_effect":
        hold("before_effect", args.hold_seconds)
    effect = perform_effect(args, digest)
    emit("effect_committed", **effect)
    if args.crash_point == "after_effect":
        hold("after_effect", args.hold_seconds)
    if args.report_gate:
        emit("awaiting_report_gate")
        wait_for_file(args.report_gate, args.gate_timeout, "report_gate")
    status, report = post(
        args.url,
        token,
        f"/api/v1/operations/{args.key}/result",
        {
            "fencing_token": fencing_token,
            "outcome": "committed",
            "provider_reference": effect["reference"],
        },
        args.timeout,
    )
    emit("reported", status=status, body=report)
    emit("done")
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="Settle's base URL (the live server)")
    parser.add_argument("--key", required=True)
    parser.add_argument("--worker", required=True, help="this worker's name")
    parser.add_argument("--mode", choices=("resume", "dispatch"), required=True)
    parser.add_argument("--params", default="{}", help="the operation's params as JSON")
    parser.add_argument("--digest", default="", help="params digest (else computed)")
    parser.add_argument("--effect", choices=("none", "sqlite", "journal", "http"), default="none")
    parser.add_argument("--provider-path", default="")
    parser.add_argument("--provider-url", default="")
    parser.add_argument("--reference", default="")
    parser.add_argument("--corrupt-checksum", action="store_true")
    parser.add_argument(
        "--crash-point", choices=("none", "before_effect", "after_effect"), default="none"
    )
    parser.add_argument("--go-file", default="", help="print ready, wait for this file")
    parser.add_argument("--report-gate", default="", help="wait for this file before reporting")
    parser.add_argument("--gate-timeout", type=float, default=60.0)
    parser.add_argument("--hold-seconds", type=float, default=120.0)
    parser.add_argument("--timeout", type=float, default=60.0, help="HTTP timeout")
    parser.add_argument(
        "--poll-seconds",
        type=float,
        default=0.0,
        help="resume: ask again after retry_after while in_progress, for at most this long",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.poll_seconds and args.mode != "resume":
        emit("error", error="--poll-seconds is for --mode resume")
        return 2
    token = os.environ.get("SETTLE_HOST_TOKEN", "")
    if not token:
        emit("error", error="SETTLE_HOST_TOKEN is not set")
        return 2
    try:
        return run(args, token)
    except Malformed as exc:
        emit("malformed", error=str(exc))
        return 2
    except (urllib.error.URLError, OSError) as exc:
        emit("transport_error", error=f"{type(exc).__name__}: {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
