"""Alerts to operators: rules evaluated by beat, grouped messages sent through Apprise.

A rule (``AlertRule``, set in the admin) watches one condition for one provider, or for
every provider together. Each evaluation reads the health facts once for all rules
(``monitoring.selectors.health``) and, per rule:

quiet → firing
    one message, "FIRING", with the figures and a link to the console page that shows
    them; ``firing_since`` set.
firing, still
    nothing, until ``window_minutes`` passed since the last message: then one reminder
    with the figures as they are. One message per rule per window, however many
    operations are involved.
firing → quiet
    one "resolved" message.

``reconcile_entered`` counts the operations that entered ``reconcile`` since the last
evaluation (since the last message, while firing: a reminder says how many more came);
it stays firing while any of the provider's operations waits in ``reconcile`` and
resolves when none does.

The decision and the rule's state are written under the state's row lock; the message
is sent after the commit, outside any transaction. A message Apprise could not deliver
is recorded on the state (``send_error``); a firing one is sent again at the next
evaluation.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlencode

from django.conf import settings
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from audit.chain import audit_append, audit_transaction
from audit.kinds import AuditKind
from common.actors import Actor
from common.notify import apprise_notify
from monitoring.models import AlertRule, AlertState
from monitoring.selectors.health import HealthFacts, ProviderFacts, health_facts
from monitoring.selectors.health import reconcile_entered_since as entered_since
from recovery.models import State

logger = logging.getLogger(__name__)

Kind = AlertRule.Kind


def _rule_record(rule: AlertRule) -> dict[str, object]:
    """What the audit log says of a rule: never its URLs, which carry channel secrets."""
    return {
        "name": rule.name,
        "provider": rule.provider.name if rule.provider is not None else None,
        "kind": rule.kind,
        "threshold": rule.threshold,
        "window_minutes": rule.window_minutes,
        "enabled": rule.enabled,
    }


def _rule_configured(rule_id: int, name: str, actor: Actor, change: str, **data: object) -> None:
    audit_append(
        kind=AuditKind.ALERT_RULE_CONFIGURED,
        actor=actor,
        data={"rule_id": rule_id, "rule": name, "change": change, **data},
    )


@audit_transaction()
def alert_rule_save(*, rule: AlertRule, urls_replaced: bool, actor: Actor) -> AlertRule:
    """Save ``rule`` as an operator set it (new or changed); audited, its URLs never.

    Who silenced an alert, or sent it elsewhere, is on the record: the fields that
    changed, old and new, and whether the URLs were replaced.
    """
    stored = AlertRule.objects.select_for_update().filter(pk=rule.pk).first() if rule.pk else None
    before = _rule_record(stored) if stored is not None else None
    rule.save()
    after = _rule_record(rule)
    changes = {
        field: [None if before is None else before[field], value]
        for field, value in after.items()
        if before is None or before[field] != value
    }
    _rule_configured(
        rule.pk,
        rule.name,
        actor,
        "added" if before is None else "changed",
        changes=changes,
        urls_replaced=urls_replaced,
    )
    return rule


@audit_transaction()
def alert_rule_delete(*, rule_id: int, actor: Actor) -> None:
    """Delete a rule (its state goes with it); audited with what it was."""
    rule = AlertRule.objects.select_for_update().filter(pk=rule_id).first()
    if rule is None:
        return
    record = _rule_record(rule)
    rule.delete()
    _rule_configured(rule_id, str(record["name"]), actor, "deleted", rule_was=record)


@dataclass(frozen=True)
class Condition:
    """What a rule found: whether it holds, in words, and the console page that shows it."""

    firing: bool
    summary: str
    path: str
    # Something a reminder would tell that the last message did not (reconcile_entered:
    # more operations entered); the other kinds' figures are always worth restating.
    news: bool = True


@dataclass(frozen=True)
class Message:
    """One notification to send for one rule."""

    rule_id: int
    urls: list[str]
    title: str
    body: str
    firing: bool


def alerts_evaluate(*, now: datetime | None = None) -> list[Message]:
    """Evaluate every enabled rule and send what is due; the messages, sent or not."""
    now = now or timezone.now()
    facts = health_facts(now=now)
    sent = []
    for rule in AlertRule.objects.filter(enabled=True).select_related("provider").order_by("pk"):
        try:
            message = alert_rule_step(rule=rule, facts=facts)
        except Exception:  # one broken rule must not silence the others
            logger.exception("alerts: evaluating rule %s failed", rule.pk)
            continue
        if message is not None:
            alert_deliver(message=message, now=now)
            sent.append(message)
    return sent


@transaction.atomic
def alert_rule_step(*, rule: AlertRule, facts: HealthFacts) -> Message | None:
    """Decide, under the rule state's lock, whether ``rule`` has something to say now."""
    now = facts.now
    window = timedelta(minutes=rule.window_minutes)
    state = AlertState.objects.select_for_update().filter(rule=rule).first()
    if state is None:
        state = AlertState.objects.create(rule=rule, evaluated_at=now - window)
    firing = state.firing_since is not None
    since = state.last_sent_at if firing and state.last_sent_at else state.evaluated_at
    condition = _condition(rule, facts, since=since, firing=firing)
    title = ""
    if condition.firing and not firing:
        state.firing_since, state.resolved_at = now, None
        title = "FIRING"
    elif condition.firing and (state.last_sent_at is None or now - state.last_sent_at >= window):
        if condition.news:
            title = "still firing"
    elif not condition.firing and firing:
        state.firing_since, state.resolved_at = None, now
        title = "resolved"
    state.evaluated_at = now
    if title:
        state.last_sent_at = now
        state.summary = condition.summary
    state.save()
    if not title:
        return None
    where = f" ({rule.provider.name})" if rule.provider else ""
    link = settings.SETTLE_CONSOLE_URL + condition.path
    return Message(
        rule_id=rule.pk,
        urls=rule.url_list,
        title=f"Settle {title}: {rule.name}{where}",
        body=f"{condition.summary}\n{link}",
        firing=condition.firing,
    )


def alert_deliver(*, message: Message, now: datetime) -> bool:
    """Send ``message`` to its rule's URLs; record a failure on the rule's state."""
    delivered = apprise_notify(urls=message.urls, title=message.title, body=message.body)
    error = "" if delivered else f"{now.isoformat()}: Apprise could not deliver {message.title!r}"
    changes: dict[str, object] = {"send_error": error}
    if not delivered:
        logger.error("alerts: %s", error)
        if message.firing:
            changes["last_sent_at"] = None  # sent again at the next evaluation
    AlertState.objects.filter(rule_id=message.rule_id).update(**changes)
    return delivered


# -- the conditions ---------------------------------------------------------------------


def _providers(rule: AlertRule, facts: HealthFacts) -> list[ProviderFacts]:
    if rule.provider_id is None:
        return facts.providers
    return [provider for provider in facts.providers if provider.id == rule.provider_id]


def _queue(rule: AlertRule, **filters: str) -> str:
    if rule.provider is not None:
        filters["provider"] = rule.provider.name
    query = urlencode(filters)
    return reverse("home") + (f"?{query}" if query else "")


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min"


def _condition(rule: AlertRule, facts: HealthFacts, *, since: datetime, firing: bool) -> Condition:
    providers = _providers(rule, facts)
    threshold = rule.threshold
    if rule.kind == Kind.RECONCILE_ENTERED:
        entered = entered_since(since=since, provider_id=rule.provider_id)
        waiting = sum(provider.states.get(State.RECONCILE, 0) for provider in providers)
        holds = waiting > 0 if firing else entered >= max(threshold, 1)
        return Condition(
            holds,
            f"{entered} operations entered reconcile since {since:%Y-%m-%d %H:%M} UTC; "
            f"{waiting} wait in reconcile.",
            _queue(rule, state=State.RECONCILE),
            news=entered > 0,
        )
    if rule.kind == Kind.STUCK_OLDEST:
        oldest = min(
            (p.oldest_stuck for p in providers if p.oldest_stuck is not None), default=None
        )
        age = facts.age(oldest, facts.now) or 0.0
        return Condition(
            age > threshold * 60,
            f"The oldest stuck operation has waited {_minutes(age)} (threshold {threshold} min).",
            _queue(rule),
        )
    if rule.kind == Kind.STUCK_COUNT:
        stuck = sum(provider.stuck for provider in providers)
        return Condition(
            stuck > threshold,
            f"{stuck} operations are stuck in unknown or reconcile (threshold {threshold}).",
            _queue(rule),
        )
    if rule.kind == Kind.LOOKUPS_FAILING:
        failing = [
            (provider.name, facts.age(provider.unavailable_since, facts.now) or 0.0)
            for provider in providers
            if provider.unavailable_since is not None
        ]
        late = [(name, age) for name, age in failing if age >= threshold * 60]
        names = ", ".join(f"{name} for {_minutes(age)}" for name, age in late) or "none"
        return Condition(
            bool(late),
            f"Lookups answering only unavailable: {names} (threshold {threshold} min).",
            reverse("status"),
        )
    if rule.kind == Kind.NO_SWEEP:
        sweep_age = facts.sweep_age
        said = "never" if sweep_age is None else f"{_minutes(sweep_age)} ago"
        return Condition(
            sweep_age is None or sweep_age > threshold * 60,
            f"The last sweep finished {said} (threshold {threshold} min): is beat running?",
            reverse("status"),
        )
    if rule.kind == Kind.AUDIT_BROKEN:
        return Condition(
            facts.open_alarms > 0,
            f"{facts.open_alarms} open audit_broken alarms.",
            reverse("audit") + "#alarms",
        )
    raise ValueError(f"unknown alert kind {rule.kind!r}")
