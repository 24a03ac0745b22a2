"""The metrics directory shared by a machine's processes: tidied, never wiped."""

from __future__ import annotations

import os
import subprocess

from monitoring.metrics import metrics_dir_tidy


def test_starting_a_process_removes_only_the_files_of_dead_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    dead = subprocess.Popen(["true"])
    dead.wait()
    mine = tmp_path / f"counter_{os.getpid()}.db"
    gone = tmp_path / f"histogram_{dead.pid}.db"
    live_gauge = tmp_path / f"gauge_livesum_{os.getppid()}.db"
    for path in (mine, gone, live_gauge):
        path.write_bytes(b"")
    assert metrics_dir_tidy() == 1
    assert mine.exists() and live_gauge.exists() and not gone.exists()
