"""A host process that runs one action through ``settle_client.Host.run``, to be killed.

Run by the client's kill and race tests as ``python tests/procs/host_run.py ...`` with the
host token in ``SETTLE_HOST_TOKEN``. The effect performs the operation at the provider
with the "outside tools" of ``harness/providers.py`` (no Django), and first appends
a line to ``--effects-log``, so a test counts every call of the effect, not only those
the provider kept.

``--crash-point`` makes the process print ``holding`` and sleep (bounded) at one moment,
for the test to SIGKILL it there: ``before_dispatch`` (the dispatch request is about to
be sent), ``before_commit`` / ``after_commit`` (inside the effect, around the provider's
commit), ``before_report`` (the effect returned, the report is about to be sent). The
pauses at requests are made by an ``httpx`` transport around the real one.

Printed (JSON lines, flushed, as ``tests/procs/worker.py``): ``ready``, ``holding``,
``effect``, then ``outcome`` (state, recovered, ran_effect, reference) or ``refused``
(the exception's class, code, and its state and reason if it has them). Exit 0 unless the
process could not run (2) or held without being killed (4).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import settle_client  # noqa: E402

from harness import providers  # noqa: E402
from harness.processes import emit, wait_for_file  # noqa: E402


def hold(stage: str, seconds: float) -> None:
    emit("holding", stage=stage)
    time.sleep(seconds)
    emit("hold_expired", stage=stage)
    sys.exit(4)


class PausingTransport(httpx.HTTPTransport):
    """Holds before sending the request whose path ends with ``pause_at``."""

    def __init__(self, pause_at: str, hold_seconds: float) -> None:
        super().__init__()
        self.pause_at = pause_at
        self.hold_seconds = hold_seconds

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.pause_at and request.url.path.endswith(self.pause_at):
            hold(self.pause_at.strip("/"), self.hold_seconds)
        return super().handle_request(request)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--provider", required=True, help="the provider's name at Settle")
    parser.add_argument("--effect", choices=("sqlite", "journal", "http"), required=True)
    parser.add_argument("--provider-path", default="")
    parser.add_argument("--provider-url", default="")
    parser.add_argument("--params", default="{}")
    parser.add_argument("--effects-log", required=True)
    parser.add_argument(
        "--crash-point",
        choices=("none", "before_dispatch", "before_commit", "after_commit", "before_report"),
        default="none",
    )
    parser.add_argument("--go-file", default="")
    parser.add_argument("--hold-seconds", type=float, default=60.0)
    parser.add_argument("--settle-timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    params: dict[str, Any] = json.loads(args.params)
    pause_at = {"before_dispatch": "/dispatch", "before_report": "/result"}.get(
        args.crash_point, ""
    )

    def effect(fencing_token: str) -> str:
        with open(args.effects_log, "a", encoding="utf-8") as log:
            log.write(json.dumps({"key": args.key, "pid": os.getpid()}) + "\n")
        if args.crash_point == "before_commit":
            hold("before_commit", args.hold_seconds)
        reference = f"ref-{args.key}"
        providers.provider_perform(
            args.effect,
            path=args.provider_path,
            url=args.provider_url,
            operation_key=args.key,
            params=params,
            reference=reference,
        )
        emit("effect", reference=reference)
        if args.crash_point == "after_commit":
            hold("after_commit", args.hold_seconds)
        return reference

    host = settle_client.Host(
        args.url,
        os.environ["SETTLE_HOST_TOKEN"],
        worker=args.worker,
        settle_timeout=args.settle_timeout,
        poll_interval=0.1,
        transport=PausingTransport(pause_at, args.hold_seconds),
    )
    if args.go_file:
        emit("ready")
        wait_for_file(args.go_file, 60.0, "go")
    try:
        outcome = host.run(
            args.key, action="payment.send", provider=args.provider, params=params, effect=effect
        )
    except settle_client.SettleError as exc:
        emit(
            "refused",
            error=type(exc).__name__,
            code=exc.code,
            state=getattr(exc, "state", ""),
            reason=getattr(exc, "reason", ""),
            message=str(exc),
        )
        return 0
    emit(
        "outcome",
        state=outcome.state,
        recovered=outcome.recovered,
        ran_effect=outcome.ran_effect,
        reference=outcome.reference,
        error=repr(outcome.error) if outcome.error else None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
