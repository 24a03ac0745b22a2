"""Whether this run is CI's strict one (PostgreSQL, nothing skipped)."""

from __future__ import annotations

import os

# CI sets SETTLE_REQUIRE_POSTGRES: there the suite must run on PostgreSQL and nothing
# may be skipped, so a missing service or a skip marker fails the run loudly.
STRICT = bool(os.environ.get("SETTLE_REQUIRE_POSTGRES"))
