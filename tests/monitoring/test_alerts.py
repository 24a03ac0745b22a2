"""Alerts: grouped per rule and window, then resolved, posted by Apprise to a real local
HTTP server (a ``json://127.0.0.1:PORT/`` URL)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import time_machine
from django.utils import timezone

from harness.providers import _free_port
from monitoring.models import AlertRule, AlertState
from monitoring.services.alerts import alerts_evaluate
from recovery.models import Operation, Provider, Pulse
from recovery.services.runs import lookups_record, pulse_record
from tests.support.apprise_receiver import Receiver
from tests.support.console import Stuck, aged


def rule(provider: Provider | None, kind: str, url: str, **fields: Any) -> AlertRule:
    return AlertRule.objects.create(
        name=f"{kind} rule", provider=provider, kind=kind, urls=url, **fields
    )


def later(minutes: float) -> Any:
    return time_machine.travel(timezone.now() + timedelta(minutes=minutes), tick=True)


def test_operations_entering_reconcile_make_one_message_per_window(
    stuck: Stuck, provider: Provider, receiver: Receiver, settings
):
    settings.SETTLE_CONSOLE_URL = "https://settle.example.com"
    rule(provider, AlertRule.Kind.RECONCILE_ENTERED, receiver.url, window_minutes=30)
    for number in range(3):
        stuck.mismatch(f"op-{number}")
    alerts_evaluate()
    [message] = receiver.take()
    assert message["title"] == "Settle FIRING: reconcile_entered rule (orders)"
    assert message["message"].startswith("3 operations entered reconcile since ")
    assert "3 wait in reconcile." in message["message"]
    assert message["message"].endswith(
        "https://settle.example.com/?state=reconcile&provider=orders"
    )
    alerts_evaluate()
    stuck.mismatch("op-3")
    alerts_evaluate()
    assert receiver.take() == []  # within the window: nothing more, however many enter

    with later(31):
        alerts_evaluate()
        [reminder] = receiver.take()
        assert reminder["title"] == "Settle still firing: reconcile_entered rule (orders)"
        assert reminder["message"].startswith("1 operations entered reconcile since ")
        alerts_evaluate()
        assert receiver.take() == []


def test_a_quiet_window_sends_no_reminder_for_reconcile(
    stuck: Stuck, provider: Provider, receiver: Receiver
):
    rule(provider, AlertRule.Kind.RECONCILE_ENTERED, receiver.url, window_minutes=10)
    stuck.mismatch("op-1")
    alerts_evaluate()
    assert len(receiver.take()) == 1
    with later(11):
        alerts_evaluate()
        assert receiver.take() == []  # still waiting in reconcile, but nothing new entered
        assert AlertState.objects.get().firing_since is not None


def test_the_alert_resolves_once_the_condition_clears(
    stuck: Stuck, provider: Provider, receiver: Receiver
):
    rule(provider, AlertRule.Kind.STUCK_COUNT, receiver.url, threshold=1)
    stuck.unknown("op-1")
    alerts_evaluate()
    assert receiver.take() == []  # 1 is not more than 1
    stuck.unknown("op-2")
    alerts_evaluate()
    [firing] = receiver.take()
    assert firing["title"] == "Settle FIRING: stuck_count rule (orders)"
    assert firing["message"].startswith("2 operations are stuck in unknown or reconcile")
    Operation.objects.filter(key="op-2").update(state="voided")  # as if an operator voided it
    alerts_evaluate()
    [resolved] = receiver.take()
    assert resolved["title"] == "Settle resolved: stuck_count rule (orders)"
    state = AlertState.objects.get()
    assert state.firing_since is None and state.resolved_at is not None
    alerts_evaluate()
    assert receiver.take() == []


def test_a_rule_watches_only_its_provider(
    stuck: Stuck, provider: Provider, other_provider: Provider, receiver: Receiver
):
    rule(other_provider, AlertRule.Kind.STUCK_COUNT, receiver.url, threshold=0)
    stuck.unknown("op-1")
    alerts_evaluate()
    assert receiver.take() == []
    rule(None, AlertRule.Kind.STUCK_OLDEST, receiver.url, threshold=5)
    aged(Operation.objects.get(key="op-1"), minutes=6)
    alerts_evaluate()
    [message] = receiver.take()
    assert message["title"] == "Settle FIRING: stuck_oldest rule"
    assert message["message"].startswith("The oldest stuck operation has waited 6 min")


def test_no_sweep_fires_when_beat_stops_and_resolves_when_it_sweeps_again(
    db: None, receiver: Receiver
):
    rule(None, AlertRule.Kind.NO_SWEEP, receiver.url, threshold=2)
    pulse_record(name=Pulse.Name.SWEEP, seconds=0.1)
    alerts_evaluate()
    assert receiver.take() == []
    with later(3):
        alerts_evaluate()
        [firing] = receiver.take()
        assert firing["title"] == "Settle FIRING: no_sweep rule"
        assert "The last sweep finished 3 min ago" in firing["message"]
        assert firing["message"].endswith("/status/")
        pulse_record(name=Pulse.Name.SWEEP, seconds=0.1)
        alerts_evaluate()
        [resolved] = receiver.take()
        assert resolved["title"] == "Settle resolved: no_sweep rule"


def test_lookups_failing_fires_after_n_minutes_of_unavailable_only(
    provider: Provider, receiver: Receiver
):
    rule(provider, AlertRule.Kind.LOOKUPS_FAILING, receiver.url, threshold=10)
    lookups_record(provider=provider, verdicts=["unavailable"])
    alerts_evaluate()
    assert receiver.take() == []
    with later(11):
        lookups_record(provider=provider, verdicts=["unavailable", "unavailable"])
        alerts_evaluate()
        [firing] = receiver.take()
        assert "orders for 11 min" in firing["message"]
        lookups_record(provider=provider, verdicts=["unavailable", "absent"])
        alerts_evaluate()
        assert receiver.take()[0]["title"] == "Settle resolved: lookups_failing rule (orders)"


def test_an_undelivered_alert_is_recorded_and_sent_again(
    stuck: Stuck, provider: Provider, receiver: Receiver
):
    port = _free_port()  # nobody listens there
    alert = rule(provider, AlertRule.Kind.STUCK_COUNT, f"json://127.0.0.1:{port}/", threshold=0)
    stuck.unknown("op-1")
    alerts_evaluate()
    state = AlertState.objects.get()
    assert "could not deliver" in state.send_error
    assert state.firing_since is not None and state.last_sent_at is None
    AlertRule.objects.filter(pk=alert.pk).update(urls=receiver.url)
    alerts_evaluate()
    [message] = receiver.take()
    assert message["title"] == "Settle still firing: stuck_count rule (orders)"
    assert AlertState.objects.get().send_error == ""


def test_a_disabled_rule_says_nothing(stuck: Stuck, provider: Provider, receiver: Receiver):
    rule(provider, AlertRule.Kind.STUCK_COUNT, receiver.url, threshold=0, enabled=False)
    stuck.unknown("op-1")
    assert alerts_evaluate() == []
    assert receiver.take() == []
