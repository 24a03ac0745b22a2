"""Operations driven through the host API in-process: a JSON client holding a token,
``Flow`` (register, approve, dispatch, resume), and the background lookups run here."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django.test import Client

from harness.providers import digest_of
from recovery.models import Provider

PARAMS = {"amount": 1250, "currency": "EUR", "to": "acct-7"}


def lookup_due(key: str) -> None:
    """Time passes until the operation's next lookup is due (resume looks up only then)."""
    from datetime import timedelta

    from django.utils import timezone

    from recovery.models import Operation

    Operation.objects.filter(key=key).update(next_lookup_at=timezone.now() - timedelta(seconds=1))


def queued_lookups_run() -> int:
    """Run every queued lookup attempt as a background worker runs it; how many ran.

    Resume and the console queue lookups for Celery; here the worker's work is done in
    this process, by the task's own body (``lookup_attempt_run``), in id order.
    """
    from recovery.models import LookupAttempt
    from recovery.services.lookup_tasks import lookup_attempt_run

    queued = LookupAttempt.objects.filter(status=LookupAttempt.Status.QUEUED).order_by("pk")
    ran = 0
    for attempt_id in queued.values_list("pk", flat=True):
        ran += lookup_attempt_run(attempt_id=attempt_id).looked_up
    return ran


def lookups_published() -> list[int]:
    """Take every message published to this run's queue so far: the attempts they name.

    Read from the broker itself (CI: Redis), as a worker would receive them.
    """
    from celery import current_app
    from django.conf import settings

    attempt_ids = []
    with current_app.connection_for_read() as broker:
        messages = broker.SimpleQueue(settings.CELERY_TASK_DEFAULT_QUEUE)
        while True:
            # One message at a time (Redis: RPOP), never a blocking read that closing the
            # queue would wait out; a commit's publish is done before the commit returns.
            try:
                message = messages.get_nowait()
            except messages.Empty:
                break
            assert message.headers["task"] == "recovery.tasks.lookup_attempt", message.headers
            args, _, _ = message.payload  # Celery's message protocol 2
            attempt_ids.append(int(args[0]))
            message.ack()
        messages.close()
    return attempt_ids


@dataclass
class Api:
    """A JSON client holding one bearer token."""

    token: str
    client: Client = field(default_factory=Client)

    def post(self, path: str, body: Any = None, *, raw: bytes | None = None, **headers: str):
        data = raw if raw is not None else json.dumps(body if body is not None else {})
        return self.client.post(
            path,
            data=data,
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {self.token}",
            **headers,
        )

    def get(self, path: str):
        return self.client.get(path, HTTP_AUTHORIZATION=f"Bearer {self.token}")


def register_body(
    key: str = "op-1", provider: str = "orders", params: dict[str, Any] | None = None, **asked: Any
) -> dict[str, Any]:
    """A registration's body (``POST /api/v1/operations``), with what else is ``asked``
    in the same request (``approval``, ``dispatch``)."""
    return {
        "key": key,
        "action": "payment.send",
        "provider": provider,
        "params": params if params is not None else PARAMS,
        **asked,
    }


class Flow:
    """Drives one operation through the API: register → approve → dispatch…"""

    def __init__(self, host_api: Api, approver_api: Api, provider: Provider) -> None:
        self.host_api = host_api
        self.approver_api = approver_api
        self.provider = provider

    def register(self, key: str = "op-1", params: dict[str, Any] | None = None) -> dict[str, Any]:
        response = self.host_api.post(
            "/api/v1/operations", register_body(key, self.provider.name, params)
        )
        assert response.status_code in (200, 201), response.content
        return response.json()

    def approve(self, key: str = "op-1", ttl_seconds: int = 300) -> dict[str, Any]:
        approval = self.host_api.post(f"/api/v1/operations/{key}/approvals").json()
        path = f"/api/v1/approvals/{approval['approval_id']}"
        reviewed = self.approver_api.get(path).json()  # the approver sees the exact action
        response = self.approver_api.post(
            f"{path}/decision",
            {
                "decision": "approve",
                "ttl_seconds": ttl_seconds,
                "params_digest": reviewed["params_digest"],
            },
        )
        assert response.status_code == 200, response.content
        return response.json()

    def approved(self, key: str = "op-1", params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.register(key, params)
        return self.approve(key)

    def dispatch(self, key: str = "op-1", digest: str | None = None, worker: str = "w1"):
        return self.host_api.post(
            f"/api/v1/operations/{key}/dispatch",
            {"worker": worker, "params_digest": digest or digest_of(PARAMS)},
        )

    def resume(self, key: str = "op-1", worker: str = "w2") -> dict[str, Any]:
        response = self.host_api.post(f"/api/v1/operations/{key}/resume", {"worker": worker})
        assert response.status_code == 200, response.content
        return response.json()

    def resume_looked_up(self, key: str = "op-1", worker: str = "w2") -> dict[str, Any]:
        """Resume as a host that polls: the lookup it queued runs, then it asks again."""
        first = self.resume(key, worker)
        assert first["decision"] == "in_progress" and first["state"] != "dispatched", first
        assert queued_lookups_run() == 1
        return self.resume(key, worker)

    def record(self, key: str = "op-1") -> dict[str, Any]:
        return self.host_api.get(f"/api/v1/operations/{key}").json()
