from __future__ import annotations

from django.apps import AppConfig


class BenchConfig(AppConfig):
    """The benchmarks' commands (``manage.py benchmark_*``), in a checkout only."""

    name = "bench"
    verbose_name = "Benchmarks"
