"""Measurement tools: figures, not tests (``docs/benchmarks.md``). Not part of a runtime install.

``api.py`` and ``core.py`` are scripts (``python bench/api.py``); ``recovery.py`` is the
body of ``manage.py benchmark_recovery``.
"""
