"""Instructions a piece of this process's work executes, counted by valgrind's callgrind.

A CPU time on a shared machine moves by a third from one minute to the next; the number
of instructions the same work executes does not (the same total twice, whatever else the
machine runs). ``run_counted`` runs a command under ``valgrind --tool=callgrind`` with
counting off until the command says when: the command calls ``Marks.start()`` after its
warm-up, then ``Marks.mark(name)`` after each piece it wants counted, and each mark
writes the instructions since the previous one to a dump of callgrind's, which
``run_counted`` reads back, sums by name and deletes.

The marks are valgrind's client requests (``valgrind/callgrind.h``), machine code that
Python cannot emit: ``Marks`` compiles a five-line C library with the machine's ``gcc``
once into a temporary folder and calls it through ``ctypes``. Outside valgrind the
requests do nothing.

Counted: everything this process executes between the marks, the interpreter, Django,
psycopg and libpq included; not the database server's work, nor the kernel's.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

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


def run_counted(command: list[str]) -> dict[str, list[int]]:
    """Run ``command`` (a Python script and its arguments) under callgrind; the instructions
    between its marks, by mark name, in order."""
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
        return dict(counts)
