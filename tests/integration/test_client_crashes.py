"""``settle_client.Host.run`` in real processes, SIGKILLed at each moment of a lifecycle.

Each host is ``tests/procs/host_run.py``: it calls ``run()`` with an effect that performs
the operation at a journal provider (append-only, so a second effect would be a second
line) and logs every call of the effect. A fresh process then calls the same ``run()``
with the same key: it must get the right outcome without calling the effect again, and
the provider must hold exactly the effects that were committed. Resume's lookups run on
a real Celery worker (``lookup_worker``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from recovery.models import Dispatch
from tests.support.flow import PARAMS
from tests.support.live import (
    REPO_ROOT,
    Procs,
    ProviderHandle,
    Settle,
    Worker,
    assert_audit_intact,
    operation,
)

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("lookup_worker"),
]

HOST_RUN = REPO_ROOT / "tests" / "procs" / "host_run.py"


def host_run(
    procs: Procs,
    provider: ProviderHandle,
    key: str,
    effects_log: Path,
    *,
    name: str,
    crash_point: str = "none",
    go_file: Path | None = None,
) -> Worker:
    command = [
        sys.executable,
        str(HOST_RUN),
        "--url",
        procs.settle.base_url,
        "--key",
        key,
        "--worker",
        name,
        "--provider",
        provider.name,
        "--effect",
        provider.kind,
        "--provider-path",
        provider.path,
        "--params",
        json.dumps(PARAMS),
        "--effects-log",
        str(effects_log),
        "--crash-point",
        crash_point,
    ]
    if go_file is not None:
        command += ["--go-file", str(go_file)]
    return procs.spawn(command, name)


def effect_calls(effects_log: Path, key: str) -> int:
    if not effects_log.exists():
        return 0
    lines = effects_log.read_text("utf-8").splitlines()
    return sum(1 for line in lines if json.loads(line)["key"] == key)


def ending(worker: Worker) -> dict[str, Any]:
    worker.assert_clean_exit()
    names = worker.event_names()
    assert "outcome" in names or "refused" in names, worker.events
    return worker.events[-1]


@pytest.mark.parametrize(
    ("point", "committed", "expected"),
    [
        ("before_dispatch", 1, {"event": "outcome", "state": "released", "recovered": False}),
        ("before_commit", 0, {"event": "refused", "error": "NeedsOperator"}),
        ("after_commit", 1, {"event": "outcome", "state": "released", "recovered": True}),
        ("before_report", 1, {"event": "outcome", "state": "released", "recovered": True}),
    ],
)
def test_a_fresh_run_after_a_sigkill_gets_the_outcome_without_a_second_effect(
    settle: Settle,
    make_provider: Any,
    procs: Procs,
    tmp_path: Path,
    point: str,
    committed: int,
    expected: dict[str, Any],
) -> None:
    provider = make_provider("journal", lease_seconds=1, lookup_budget=1)
    key = f"client-kill-{point}"
    settle.approved(key, provider.name)
    log = tmp_path / "effects.log"

    doomed = host_run(procs, provider, key, log, name="doomed", crash_point=point)
    doomed.wait_for("holding")
    doomed.kill()
    calls_before = effect_calls(log, key)

    fresh = host_run(procs, provider, key, log, name="fresh")
    end = ending(fresh)

    assert {name: end.get(name) for name in expected} == expected, fresh.events
    if point == "before_dispatch":
        # Nothing was dispatched: the fresh run is the one that runs it, once.
        assert end["ran_effect"] is True and calls_before == 0
    else:
        assert "effect" not in fresh.event_names()
        assert effect_calls(log, key) == calls_before == 1
    if point == "before_commit":
        assert end["state"] == "reconcile" and end["reason"] == "reconcile"
    assert provider.effects(key) == committed
    assert Dispatch.objects.filter(operation=operation(key)).count() == 1
    assert_audit_intact()


def test_twelve_processes_running_one_key_at_once_perform_one_effect(
    settle: Settle, make_provider: Any, procs: Procs, tmp_path: Path
) -> None:
    provider = make_provider("journal", lease_seconds=5)
    key = "client-race"
    settle.approved(key, provider.name)
    log = tmp_path / "effects.log"
    go = procs.go_file()
    hosts = [host_run(procs, provider, key, log, name=f"h{n}", go_file=go) for n in range(12)]
    procs.release(hosts, go)

    endings = [ending(host) for host in hosts]

    assert [end["event"] for end in endings] == ["outcome"] * 12, endings
    assert {end["state"] for end in endings} == {"released"}
    assert sum(1 for end in endings if end["ran_effect"]) == 1
    assert effect_calls(log, key) == 1
    assert provider.effects(key) == 1
    assert_audit_intact()
