"""Beat and the workers die (SIGKILL): the monitors' view from outside.

Real gunicorn, Celery workers (the default queue and the webhook queue) and beat on
Redis. /livez is judged from the rows those processes write themselves, so it turns
503 within its threshold once they are gone, naming what is silent, while /healthz (the
proxy's check) stays 200; and the shipped alerting rules' expressions, evaluated by
promtool on the values scraped from /metrics, are true.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from harness.gunicorn import GunicornServer, gunicorn_start, gunicorn_stop
from tests.support.monitoring import RULES, promtool, rule_expressions, run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]
TOKEN = "metrics-token-for-the-liveness-fault-test"
LIMIT = 3  # seconds, both thresholds
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(server: GunicornServer, path: str, token: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(server.url + path)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with _LOCAL.open(request, timeout=5) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def livez(server: GunicornServer) -> tuple[int, dict[str, Any]]:
    status, body = get(server, "/livez")
    return status, json.loads(body)


def wait(condition: Callable[[], bool], seconds: float, what: str) -> float:
    """Poll ``condition`` until true; how long it took. Fails past ``seconds``."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > seconds:
            raise AssertionError(f"no {what} within {seconds} s")
        time.sleep(0.1)
    return time.monotonic() - started


@pytest.fixture
def env(celery_env: dict[str, str | None]) -> dict[str, str | None]:
    return {
        **celery_env,
        "SETTLE_WORKER_HEARTBEAT_SECONDS": "1",
        "SETTLE_LIVENESS_BEAT_SECONDS": str(LIMIT),
        "SETTLE_LIVENESS_WORKER_SECONDS": str(LIMIT),
        "SETTLE_METRICS_TOKEN": TOKEN,
    }


@pytest.fixture
def server(env: dict[str, str | None], tmp_path: Path) -> Iterator[GunicornServer]:
    running = gunicorn_start(
        database_url=str(env["DATABASE_URL"]),
        log_path=tmp_path / "gunicorn.log",
        workers=2,
        env=env,
    )
    try:
        yield running
    finally:
        gunicorn_stop(running)


def scraped(server: GunicornServer, names: set[str]) -> list[tuple[str, dict[str, str], float]]:
    status, body = get(server, "/metrics", TOKEN)
    assert status == 200, body
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name in names
    ]


def series_text(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def promql_true(server: GunicornServer, alerts: list[str], directory: Path) -> dict[str, Any]:
    """Evaluate the shipped rules' expressions with promtool over the scraped values (as
    Prometheus would store them, with its job and instance labels); what each returned."""
    expressions = rule_expressions()
    names = {name for alert in alerts for name in re.findall(r"settle_\w+", expressions[alert])}
    target = {"job": "settle", "instance": "web-1"}
    samples = scraped(server, names)
    assert {name for name, _, _ in samples} == names, samples
    input_series = [
        {"series": series_text(name, {**labels, **target}), "values": f"{value!r}x4"}
        for name, labels, value in samples
    ]
    expected: dict[str, Any] = {}
    tests = []
    for alert in alerts:
        left = re.match(r"\s*(settle_\w+)", expressions[alert]).group(1)  # type: ignore[union-attr]
        # A filtering comparison that holds returns its left side's samples.
        exp_samples = [
            {"labels": series_text(name, {**labels, **target}), "value": value}
            for name, labels, value in samples
            if name == left
        ]
        expected[alert] = exp_samples
        tests.append({"expr": expressions[alert], "eval_time": "1m", "exp_samples": exp_samples})
    test_file = directory / "scraped.test.yml"
    test_file.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(RULES)],
                "evaluation_interval": "30s",
                "tests": [
                    {"interval": "30s", "input_series": input_series, "promql_expr_test": tests}
                ],
            }
        )
    )
    result = run(promtool(), "test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr + test_file.read_text()
    return expected


def test_killed_beat_and_workers_turn_livez_red_and_the_rules_true(
    env: dict[str, str | None], server: GunicornServer, celery_procs: Any, tmp_path: Path
) -> None:
    promtool()  # fail (CI) or skip before starting anything
    assert livez(server)[0] == 503  # nothing seen yet
    lookups = celery_procs("worker", env)
    webhooks = celery_procs("webhooks", env)
    beat = celery_procs("beat", env)
    wait(lambda: livez(server)[0] == 200, 30, "green /livez")

    beat.kill()  # SIGKILL: no goodbye
    took = wait(lambda: livez(server)[0] == 503, LIMIT + 3, "red /livez after beat died")
    assert took <= LIMIT + 2
    status, body = livez(server)
    assert set(body["silent"]) == {"beat"}, body  # the workers beat on without beat
    assert get(server, "/healthz")[0] == 200

    lookups.kill()
    webhooks.kill()
    killed = time.monotonic()

    def all_silent() -> bool:
        status, body = livez(server)
        return status == 503 and len(body["silent"]) == 3

    wait(all_silent, LIMIT + 3, "every process silent on /livez")
    assert time.monotonic() - killed <= LIMIT + 2
    status, body = livez(server)
    assert set(body["silent"]) == {"beat", "lookup workers", "webhook workers"}
    assert all(re.fullmatch(r"late by \d+ s", late) for late in body["silent"].values()), body
    assert str(env["SETTLE_CELERY_QUEUE"]) not in json.dumps(body)
    status, body_healthz = get(server, "/healthz")
    assert status == 200, body_healthz

    found = promql_true(server, ["SettleBeatSilent", "SettleWorkersSilent"], tmp_path)
    assert len(found["SettleBeatSilent"]) == 1
    assert {sample["labels"] for sample in found["SettleWorkersSilent"]} == {
        series_text(
            "settle_worker_last_seen_seconds",
            {"job": "settle", "instance": "web-1", "role": role, "queue": str(env[queue])},
        )
        for role, queue in (
            ("lookups", "SETTLE_CELERY_QUEUE"),
            ("webhooks", "SETTLE_WEBHOOK_QUEUE"),
        )
    }
