"""A benchmark's own database: this process pointed at a fresh, migrated one."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from django.core.management import call_command
from django.db import connection


def scratch_database_use(scratch: Path, suffix: str) -> str:
    """PostgreSQL: the configured database's name + ``suffix``, dropped and made afresh;
    SQLite: a file in ``scratch``. Migrated; returns its URL, for processes started later."""
    settings_dict = connection.settings_dict
    url = os.environ.get("DATABASE_URL", "")
    if connection.vendor == "postgresql":
        name = f"{settings_dict['NAME']}{suffix}"
        # The maintenance database: the configured one need not exist.
        with connection._nodb_cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            cursor.execute(f'CREATE DATABASE "{name}"')
        url = urlunsplit(urlsplit(url)._replace(path=f"/{name}"))
    else:
        name = str(scratch / "bench.sqlite3")
        url = f"sqlite:///{name}"
    connection.close()
    settings_dict["NAME"] = name
    call_command("migrate", verbosity=0, interactive=False)
    return url
