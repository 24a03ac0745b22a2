"""Measurement tools: figures, not tests (``docs/benchmarks.md``). Not part of a runtime install.

An app wherever it can be imported (a checkout, ``settle.settings``): its commands,
``manage.py benchmark_*``, run ``audit.py``, ``bulk.py``, ``console.py``, ``metrics.py``,
``recovery.py`` and ``webhooks.py``. ``api.py`` and ``core.py`` are scripts
(``python bench/api.py``); ``api_*.py`` hold the API benchmark's parts.
"""
