"""The webhook tests' receivers and endpoint: real HTTP servers on this machine."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from common.actors import COMMAND_LINE
from tests.support.webhook_receiver import Receiver, Silent, receiver_serve, silent_serve
from webhooks.endpoints import webhook_endpoint_add
from webhooks.models import WebhookEndpoint


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    yield from receiver_serve(Receiver())


@pytest.fixture
def silent() -> Iterator[Silent]:
    yield from silent_serve()


@pytest.fixture
def allow_private(settings: Any) -> None:
    settings.SETTLE_WEBHOOKS_ALLOW_PRIVATE = True


@pytest.fixture
def endpoint(host: Any, receiver: Receiver, allow_private: None) -> WebhookEndpoint:
    added, secret = webhook_endpoint_add(host_name=host.name, url=receiver.url, actor=COMMAND_LINE)
    receiver.secrets.append(secret)
    return added
