"""The approvers' messages' Apprise target: a real HTTP server on this machine."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.apprise_receiver import Receiver, receiver_serve


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    yield from receiver_serve()
