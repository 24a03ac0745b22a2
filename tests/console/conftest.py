"""The console's cast: an operator, a viewer and an outsider, and operations that wait.

``orders`` is the provider the operator (and the viewer) work on; ``ledger`` is another
provider, whose operator is the outsider. Operations reach the queue through the host
API, the way they do in production: registered, approved, dispatched, the worker's
lease lapses, a fresh worker's resume queues a lookup of the record, and a background
worker (the task's body, run here) looks it up.

The operator, the viewer, the supervisor, the outsider, ``stuck``, ``other_stuck`` and
``other_provider``, which other apps' tests use too, are in ``tests/conftest.py``; the
helpers behind them in ``tests/support/console.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client


@pytest.fixture
def signed_in(client: Client) -> Any:
    """``signed_in(user)``: the test's client, signed in as ``user``."""

    def sign_in(user: User) -> Client:
        client.force_login(user)
        return client

    return sign_in
