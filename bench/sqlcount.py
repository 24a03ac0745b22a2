"""Counting the SQL statements a process sends: ``manage.py benchmark_recovery`` and the
SQL pass of ``bench/api.py`` (``bench/counting_wsgi.py``, per request).

What is counted: every statement Django executes
through a cursor (``executemany`` counts one per parameter set; savepoints included),
+1 ``BEGIN`` for each transaction that executed something (psycopg sends it implicitly
with the first statement), +1 ``COMMIT``/``ROLLBACK`` when it ends. Connection set-up
is not counted.

A Celery worker counts when ``SETTLE_SQL_COUNT_DIR`` is set (``bench.apps``, so only a
worker started from a checkout): each pool process rewrites ``<dir>/<pid>.json`` with its
totals after every task.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from celery.signals import task_postrun
from django.db import DEFAULT_DB_ALIAS, connections


@dataclass
class StatementCount:
    statements: int = 0
    begin: int = 0
    commit: int = 0
    rollback: int = 0
    open: bool = False  # a transaction whose BEGIN was counted has not ended yet

    @property
    def total(self) -> int:
        return self.statements + self.begin + self.commit + self.rollback

    def detail(self) -> str:
        return (
            f"statements={self.statements} begin={self.begin} "
            f"commit={self.commit} rollback={self.rollback}"
        )

    def as_dict(self) -> dict[str, int]:
        fields = asdict(self)
        fields.pop("open")
        return {**fields, "total": self.total}


def counting(into: StatementCount | Callable[[], StatementCount | None]) -> Callable[[], None]:
    """Count every statement of this thread's default connection, from now.

    ``into``: the count, or a function that says which count is current (None: count
    nothing now), as a server counting each request on its own does. Returns what stops
    the counting: a connection that is watched runs each statement through Django's
    own cursor (``dbsql.cursor``), so a test must not leave it watched.
    """
    target: Any = connections[DEFAULT_DB_ALIAS]
    current = into if callable(into) else lambda: into

    def execute(run: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        count = current()
        if count is not None:
            if not target.get_autocommit() and not count.open:
                count.begin += 1
                count.open = True
            count.statements += len(params) if many and params is not None else 1
        return run(sql, params, many, context)

    def ending(original: Callable[[], None], kind: str) -> Callable[[], None]:
        def end() -> None:
            count = current()
            if count is not None and count.open:
                setattr(count, kind, getattr(count, kind) + 1)
                count.open = False
            original()

        return end

    target.execute_wrappers.append(execute)
    # Django does not send COMMIT/ROLLBACK through execute wrappers; instance attributes
    # shadow the methods it calls (``self._commit()``).
    shadowed = {name: target.__dict__.get(name) for name in ("_commit", "_rollback")}
    target._commit = ending(target._commit, "commit")
    target._rollback = ending(target._rollback, "rollback")

    def stop() -> None:
        target.execute_wrappers.remove(execute)
        for name, before in shadowed.items():
            if before is None:
                delattr(target, name)
            else:
                setattr(target, name, before)

    return stop


def count_file_write(directory: Path, count: StatementCount) -> None:
    """Write this process's totals to ``directory/<pid>.json`` (atomically replaced)."""
    path = directory / f"{os.getpid()}.json"
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(count.as_dict()))
    partial.replace(path)


def count_files_total(directory: Path) -> StatementCount:
    """The sum of every process's totals written under ``directory``."""
    total = StatementCount()
    for path in directory.glob("*.json"):
        data = json.loads(path.read_text())
        total.statements += data["statements"]
        total.begin += data["begin"]
        total.commit += data["commit"]
        total.rollback += data["rollback"]
    return total


def worker_process_counting(**_: object) -> None:
    """A Celery pool process, starting: count its statements from now, and write its
    totals to ``SETTLE_SQL_COUNT_DIR`` after every task."""
    directory = Path(os.environ["SETTLE_SQL_COUNT_DIR"])
    count = StatementCount()
    counting(count)

    def written(**_: object) -> None:
        count_file_write(directory, count)

    task_postrun.connect(written, weak=False)


@contextmanager
def statements_noted() -> Iterator[list[str]]:
    """Each statement the default connection runs inside, in a list that grows as they run.

    Not CaptureQueriesContext: a request's start empties the log it reads, and the log is
    capped, so a long run reads nothing from it.
    """
    statements: list[str] = []

    def noted(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append(sql)
        return execute(sql, params, many, context)

    with connections[DEFAULT_DB_ALIAS].execute_wrapper(noted):
        yield statements
