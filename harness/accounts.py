"""The one password of every account the tests and the benchmarks make, at Settle and the IdP."""

from __future__ import annotations

PASSWORD = "a-password-for-tests-only"
