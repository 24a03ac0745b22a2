"""The monitoring surface as the tests read it: /metrics scraped with the test token, and
the shipped Prometheus rules (deploy/) with promtool to check and evaluate them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from tests.support.strict import STRICT

# -- /metrics ----------------------------------------------------------------------------

TOKEN = "metrics-token-for-the-tests-0123456789"


def scrape(client: Client, token: str | None = TOKEN) -> Any:
    headers = {} if token is None else {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    return client.get("/metrics", **headers)


def samples(client: Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, by (name, sorted labels)."""
    response = scrape(client)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    found = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


# -- the shipped rules -------------------------------------------------------------------

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "settle-rules.yml"


def promtool() -> str:
    """Debian's promtool (`apt-get install prometheus`, as .ci/run does); CI may not lack it."""
    found = shutil.which("promtool") or (
        "/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None
    )
    if found is None:
        if STRICT:
            pytest.fail("promtool is missing: apt-get install -y prometheus")
        pytest.skip("promtool is not installed (apt-get install -y prometheus)")
    return found


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=RULES.parent, capture_output=True, text=True, timeout=60)


def rule_expressions() -> dict[str, str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}
