"""The console's users and stuck operations, for the tests that compare every layer."""

from __future__ import annotations

from tests.console.conftest import operator, stuck, viewer

__all__ = ["operator", "stuck", "viewer"]
