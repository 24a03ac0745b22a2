"""The shipped Prometheus rules and Grafana dashboard (deploy/): valid by the tools' own
validators, and naming only metrics Settle exports."""

from __future__ import annotations

import json
import re

from prometheus_client.metrics import MetricWrapperBase

import identity.metrics
import recovery.metrics
import webhooks.metrics
from monitoring.metrics import HealthCollector
from tests.support.monitoring import DEPLOY, RULES, promtool, rule_expressions, run

RULES_TEST = DEPLOY / "prometheus" / "settle-rules.test.yml"
DASHBOARD = DEPLOY / "grafana" / "settle.json"
METRIC = re.compile(r"\bsettle_[a-z0-9_]+\b")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exported() -> set[str]:
    """Every sample name /metrics can carry: the counters and histograms, and the gauges."""
    names = set()
    for module in (recovery.metrics, webhooks.metrics, identity.metrics):
        for value in vars(module).values():
            if isinstance(value, MetricWrapperBase):
                names |= {value._name + suffix for suffix in SUFFIXES[value._type]}
    for family in HealthCollector().collect():
        names.add(family.name)
    return names


def test_the_rules_pass_promtool_check_rules():
    result = run(promtool(), "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rules_unit_tests_show_beat_silent_fires():
    text = RULES_TEST.read_text()
    assert "alertname: SettleBeatSilent" in text and "exp_alerts:\n          - exp_labels" in text
    result = run(promtool(), "test", "rules", str(RULES_TEST))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_rule_names_only_metrics_settle_exports(db: None):
    names = exported()
    expressions = rule_expressions()
    assert {"SettleBeatSilent", "SettleWorkersSilent", "SettleWebhookDeliveriesLate"} <= set(
        expressions
    )
    assert {
        "SettleAuditCheckpointLate",
        "SettleAuditVerificationLate",
        "SettleAuditAlarmOpen",
    } <= set(expressions)
    for alert, expression in expressions.items():
        used = set(METRIC.findall(expression))
        assert used, alert
        assert used <= names, (alert, used - names)


def test_every_dashboard_panel_names_only_metrics_settle_exports(db: None):
    dashboard = json.loads(DASHBOARD.read_text())
    names = exported()
    assert dashboard["panels"]
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            used = set(METRIC.findall(target["expr"]))
            assert used, (panel["title"], target["expr"])
            assert used <= names, (panel["title"], used - names)
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            assert set(METRIC.findall(variable["definition"])) <= names
