"""What Settle tells Prometheus: counters the processes bump, gauges read at scrape time.

Two kinds of figure, kept apart on purpose:

events (counters, histograms)
    Declared by the app where the thing happens (``recovery.metrics``,
    ``webhooks.metrics``, ``identity.metrics``) and bumped by the
    process where it happened (a web process for a host-API request, a worker for a
    lookup or a sweep), in prometheus-client's multiprocess mode: each process writes
    its own file under ``PROMETHEUS_MULTIPROC_DIR`` (the setting ``SETTLE_METRICS_DIR``)
    and a scrape sums the files of that machine.
state (gauges)
    Read from the database when scraped, by ``HealthCollector``, through the cheap
    facts of ``monitoring.selectors.health``: an in-process counter can say how many
    operations moved, never how many are in a state now.

To add a figure: an event is one line in that app's metrics module (a
``Counter``/``Histogram``) and one call where it happens (as ``WEBHOOK_DELIVERIES`` in
``webhook_outcomes_record``); a state is one fact in ``HealthFacts`` and one
``gauge(...)`` line in ``HealthCollector.collect`` (as the outbox's backlog).

The directory is shared by the web processes and workers of one machine, so no process
empties it: each process that starts others (gunicorn's master, the Celery worker's main
process) removes the files of processes that are gone (``metrics_dir_tidy``), and a
process that exits has its live gauges dropped (``metrics_process_dead``).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from monitoring.selectors.health import HealthFacts, health_facts, liveness


class HealthCollector(Collector):
    """The gauges, read from ``health_facts`` at scrape time."""

    def collect(self) -> Iterator[Metric]:
        facts = health_facts()
        operations = GaugeMetricFamily(
            "settle_operations",
            "Operations by provider and state: in-flight states live, terminal states as "
            "beat last counted them (settle_operation_counts_age_seconds).",
            labels=["provider", "state"],
        )
        stuck_oldest = GaugeMetricFamily(
            "settle_stuck_oldest_age_seconds",
            "How long the longest-waiting unknown or reconcile operation has waited.",
            labels=["provider", "state"],
        )
        lookup_failing = GaugeMetricFamily(
            "settle_lookups_unavailable_seconds",
            "How long a provider's lookups have answered only unavailable (0: they do not).",
            labels=["provider"],
        )
        for provider in facts.providers:
            for state, count in sorted(provider.states.items()):
                operations.add_metric([provider.name, state], count)
            for state, since in sorted(provider.oldest_stuck_at.items()):
                stuck_oldest.add_metric([provider.name, state], facts.age(since, facts.now) or 0.0)
            lookup_failing.add_metric(
                [provider.name], facts.age(provider.unavailable_since, facts.now) or 0
            )
        yield operations
        yield stuck_oldest
        yield lookup_failing
        yield gauge(
            "settle_operation_counts_age_seconds",
            "Age of the snapshot the terminal states' counts come from.",
            facts.age(facts.counts_at, facts.now),
        )
        yield gauge(
            "settle_sweep_age_seconds", "Seconds since the last sweep finished.", facts.sweep_age
        )
        yield gauge(
            "settle_sweep_last_duration_seconds",
            "How long the last sweep took.",
            facts.last_sweep_seconds,
        )
        yield gauge(
            "settle_lookup_lag_seconds",
            "How long the most overdue lookup has been waiting for its answer (0: none due).",
            facts.lookup_lag,
        )
        yield gauge(
            "settle_lookup_last_age_seconds",
            "Seconds since a worker last finished a lookup.",
            facts.age(facts.last_lookup_at, facts.now),
        )
        yield gauge(
            "settle_audit_checkpoint_age_seconds",
            "Age of the newest signed audit checkpoint.",
            facts.checkpoint_age,
        )
        yield gauge("settle_audit_alarms_open", "Open audit_broken alarms.", facts.open_alarms)
        yield gauge(
            "settle_webhook_outbox_backlog",
            "Webhook messages waiting to be delivered (pending, retries included).",
            facts.webhook_backlog,
        )
        yield gauge(
            "settle_webhook_delivery_lag_seconds",
            "How long the longest-waiting due webhook message has waited for a worker of "
            "the webhook queue (0: none waits).",
            facts.webhook_lag,
        )
        yield from self.liveness()
        yield from self.audit(facts)
        # The status page's thresholds, so that alerting rules follow the settings.
        yield gauge(
            "settle_lookup_lag_threshold_seconds",
            "SETTLE_STATUS_LOOKUP_LAG_SECONDS: a due lookup is late past this.",
            settings.SETTLE_STATUS_LOOKUP_LAG_SECONDS,
        )
        yield gauge(
            "settle_webhook_lag_threshold_seconds",
            "SETTLE_STATUS_WEBHOOK_LAG_SECONDS: webhook deliveries are late past this.",
            settings.SETTLE_STATUS_WEBHOOK_LAG_SECONDS,
        )

    def liveness(self) -> Iterator[Metric]:
        """Seconds since beat and each queue's workers were last seen (+Inf: never)."""
        roles = liveness()
        workers = GaugeMetricFamily(
            "settle_worker_last_seen_seconds",
            "Seconds since a worker of the queue last ran its heartbeat (+Inf: never); role "
            "lookups (the default queue), webhooks (the webhook queue) or workers (both).",
            labels=["role", "queue"],
        )
        for role in roles:
            age = math.inf if role.age is None else role.age
            if role.queue is None:
                yield gauge(
                    "settle_beat_last_seen_seconds",
                    "Seconds since beat last published a sweep (+Inf: never).",
                    age,
                )
            else:
                workers.add_metric([role.role, role.queue], age)
        yield workers
        yield gauge(
            "settle_liveness_beat_threshold_seconds",
            "SETTLE_LIVENESS_BEAT_SECONDS: /livez calls beat silent past this.",
            settings.SETTLE_LIVENESS_BEAT_SECONDS,
        )
        yield gauge(
            "settle_liveness_worker_threshold_seconds",
            "SETTLE_LIVENESS_WORKER_SECONDS: /livez calls a queue's workers silent past this.",
            settings.SETTLE_LIVENESS_WORKER_SECONDS,
        )

    def audit(self, facts: HealthFacts) -> Iterator[Metric]:
        """How late the checkpoints and the verification are, and their thresholds."""
        yield gauge(
            "settle_audit_unsigned_oldest_age_seconds",
            "How long the oldest audit event no checkpoint signed has waited (0: none waits).",
            facts.unsigned_age,
        )
        yield gauge(
            "settle_audit_checkpoint_threshold_seconds",
            "SETTLE_STATUS_CHECKPOINT_STALE_SECONDS: an event unsigned past this is late.",
            settings.SETTLE_STATUS_CHECKPOINT_STALE_SECONDS,
        )
        yield gauge(
            "settle_audit_verification_age_seconds",
            "Seconds since the last verification of the audit log started.",
            facts.age(facts.last_verification_at, facts.now),
        )
        yield gauge(
            "settle_audit_verification_ok",
            "Whether the last verification of the audit log found it intact (1) or not (0).",
            None if facts.last_verification_ok is None else int(facts.last_verification_ok),
        )
        yield gauge(
            "settle_audit_verification_interval_seconds",
            "SETTLE_AUDIT_VERIFY_SECONDS: how often beat verifies the audit log.",
            settings.SETTLE_AUDIT_VERIFY_SECONDS,
        )


def gauge(name: str, documentation: str, value: float | None) -> GaugeMetricFamily:
    """One unlabelled gauge; with no value yet (never happened) the family has no sample."""
    family = GaugeMetricFamily(name, documentation)
    if value is not None:
        family.add_metric([], value)
    return family


def metrics_text() -> bytes:
    """The exposition: every process's counters on this machine, and the health gauges."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    registry.register(HealthCollector())
    return generate_latest(registry)


# -- the multiprocess directory ---------------------------------------------------------

_PID_FILE = re.compile(r"_(\d+)\.db$")


def metrics_dir() -> Path:
    return Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])


def metrics_dir_tidy() -> int:
    """Remove the files of processes no longer alive; how many were removed.

    Not a wipe: the web processes and workers of a machine share the directory, and one
    of them starting must not drop the others' figures.
    """
    removed = 0
    for path in metrics_dir().glob("*.db"):
        match = _PID_FILE.search(path.name)
        if match is None or _alive(int(match.group(1))):
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def metrics_process_dead(pid: int) -> None:
    """prometheus-client's bookkeeping for a process that exited (its live gauges)."""
    mark_process_dead(pid, str(metrics_dir()))  # type: ignore[no-untyped-call]
