"""Instructions a piece of this process's work executes, counted by valgrind's callgrind.

A CPU time on a shared machine moves by a third from one minute to the next; the number
of instructions the same work executes does not (the same total twice, whatever else the
machine runs). ``run_counted`` runs a command under ``valgrind --tool=callgrind`` with
counting off until the command says when: the command calls ``Marks.start()`` after its
warm-up, then ``Marks.mark(name)`` after each piece it wants counted, and each mark
writes the instructions since the previous one to a dump of callgrind's, which
``run_counted`` reads back, by name, and deletes.

The marks are valgrind's client requests (``valgrind/callgrind.h``), machine code that
Python cannot emit: ``Marks`` compiles a five-line C library with the machine's ``gcc``
once into a temporary folder and calls it through ``ctypes``. Outside valgrind the
requests do nothing.

Counted: everything this process executes between the marks, the interpreter, Django,
psycopg and libpq included; not the database server's work, nor the kernel's.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

# Set in the command's environment by ``run_counted``: the folder of callgrind's dumps.
ENVIRONMENT = "SETTLE_BENCH_CALLGRIND_DIR"

_SOURCE = """
#include <valgrind/callgrind.h>
void marks_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void marks_mark(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }
"""
_TRIGGER = re.compile(r"^desc: Trigger: Client Request: (.*)$", re.MULTILINE)
_TOTALS = re.compile(r"^(?:totals|summary): (\d+)", re.MULTILINE)


def under_callgrind() -> bool:
    """Whether this process runs under ``run_counted``."""
    return ENVIRONMENT in os.environ


class Marks:
    """The client requests, from a library built on first use."""

    def __init__(self) -> None:
        folder = Path(os.environ[ENVIRONMENT])
        source, library = folder / "marks.c", folder / "marks.so"
        source.write_text(_SOURCE)
        subprocess.run(
            ["gcc", "-O1", "-shared", "-fPIC", "-o", str(library), str(source)], check=True
        )
        self._library = ctypes.CDLL(str(library))

    def start(self) -> None:
        self._library.marks_start()

    def mark(self, name: str) -> None:
        self._library.marks_mark(name.encode())


def run_counted(command: list[str]) -> tuple[dict[str, list[int]], dict[str, Any]]:
    """Run ``command`` (a Python script and its arguments) under callgrind: the instructions
    between its marks, by mark name, in order; and what a ``Split`` saved, if any."""
    if shutil.which("valgrind") is None or shutil.which("gcc") is None:
        sys.exit("counting instructions needs valgrind and gcc (apt-get install valgrind gcc)")
    with tempfile.TemporaryDirectory(prefix="callgrind-") as folder:
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                "--dump-instr=no",
                "--compress-strings=no",
                f"--callgrind-out-file={folder}/out.%p",
                sys.executable,
                *command,
            ],
            env={**os.environ, ENVIRONMENT: folder, "PYTHONHASHSEED": "0"},
            check=True,
            stderr=subprocess.DEVNULL,
        )
        counts: dict[str, list[int]] = defaultdict(list)
        dumps = sorted(
            Path(folder).glob("out.*.*"), key=lambda path: int(path.name.rsplit(".", 1)[1])
        )
        for dump in dumps:
            text = dump.read_text(errors="replace")
            trigger, totals = _TRIGGER.search(text), _TOTALS.search(text)
            if trigger and totals:
                counts[trigger.group(1)].append(int(totals.group(1)))
        saved = Path(folder) / "calls.json"
        return dict(counts), json.loads(saved.read_text()) if saved.exists() else {}


class Split:
    """Instructions by part: each part's listed functions' own, less the listed ones they call.

    ``parts`` maps a part's name to functions given as ``module:qualified.name``; each is
    wrapped (wherever a module holds it, imported by name included) so that entering and
    leaving it marks the instructions since the last mark to the part then running. A
    wrapped call costs instructions of its own: ``calibrate`` measures them on a wrapped
    call that does nothing, and ``run_counted``'s reader (``split_figures``) takes them
    off each part (``OVERHEAD`` in the counts).
    """

    def __init__(self, marks: Marks, parts: dict[str, tuple[str, ...]], rest: str) -> None:
        self.marks, self.running, self.on = marks, [rest], False
        self.calls: dict[str, int] = defaultdict(int)  # the part's wrapped calls
        self.made: dict[str, int] = defaultdict(int)  # the wrapped calls made from the part
        for part, functions in parts.items():
            for function in functions:
                self._wrap(part, function)

    def wrapped(self, part: str, function: Any) -> Any:
        """``function``, counted as ``part`` (for a function no module holds by name: a
        URL pattern's view)."""

        @functools.wraps(function)
        def counted(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return function(*args, **kwargs)
            self.calls[part] += 1
            self.made[self.running[-1]] += 1
            self.marks.mark(self.running[-1])
            self.running.append(part)
            try:
                return function(*args, **kwargs)
            finally:
                self.marks.mark(self.running.pop())

        return counted

    def _wrap(self, part: str, target: str) -> None:
        module_name, _, name = target.partition(":")
        module = importlib.import_module(module_name)
        owner_name, _, attribute = name.rpartition(".")
        if owner_name:  # a method: wrapped on its class
            owner = getattr(module, owner_name)
            setattr(owner, attribute, self.wrapped(part, owner.__dict__[attribute]))
            return
        original = getattr(module, name)
        counted = self.wrapped(part, original)
        for each in list(sys.modules.values()):  # wherever it was imported by name
            namespace = getattr(each, "__dict__", None) or {}
            for key, value in list(namespace.items()):
                if value is original:
                    namespace[key] = counted

    def calibrate(self, calls: int = 200) -> None:
        """A wrapped call that does nothing, ``calls`` times: what a wrapped call costs."""

        def nothing() -> None:
            return None

        counted = self.wrapped(OVERHEAD, nothing)
        self.running.append(CALLER)
        self.marks.mark("(before calibrating)")
        for _ in range(calls):
            counted()
        self.marks.mark(self.running.pop())

    def save(self) -> None:
        """The calls, for the reader (``split_figures``): beside the dumps."""
        path = Path(os.environ[ENVIRONMENT]) / "calls.json"
        path.write_text(json.dumps({"calls": self.calls, "made": self.made}))


OVERHEAD, CALLER = "(a wrapped call)", "(its caller)"


def split_figures(counts: dict[str, list[int]], calls: dict[str, dict[str, int]]) -> dict[str, int]:
    """Each part's instructions less what wrapping cost it: inside each of its calls, and
    around each wrapped call it made (the calibration's figures, ``Split.calibrate``)."""
    inside = sum(counts[OVERHEAD]) / calls["calls"][OVERHEAD]
    around = sum(counts[CALLER]) / calls["made"][CALLER]  # its loop's few included
    figures = {}
    for part, values in counts.items():
        if part.startswith("("):  # the calibration's and the caller's own, not parts
            continue
        made, own = calls["made"].get(part, 0), calls["calls"].get(part, 0)
        figures[part] = round(sum(values) - own * inside - made * around)
    return figures
