"""The operator console: its views, forms, template tags, context processors and pages."""

from __future__ import annotations
