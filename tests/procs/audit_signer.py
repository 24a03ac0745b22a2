"""A signer of audit checkpoints in a process of its own, for the checkpoint file's faults.

    python tests/procs/audit_signer.py --rounds N [--slow-write S] [--die-on-write]

Each round appends one event to the system chain and signs a checkpoint
(``audit_checkpoint``), as beat's task does. Faults of the disk the checkpoint file is
on, injected into this process only: ``--slow-write`` sleeps up to S seconds (at random)
before each write to that file (a slow or contended disk); ``--die-on-write`` kills this process
(SIGKILL) at its first write to it, that is after the checkpoint's commit and before
its line reaches the file. Prints ``signed N`` for each checkpoint it made.
"""

from __future__ import annotations

import argparse
import builtins
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settle.settings")


def _faulty_open(target: Path, *, slow: float, die: bool) -> None:
    real_open = builtins.open

    def opened(file: Any, *args: Any, **kwargs: Any) -> Any:
        handle = real_open(file, *args, **kwargs)
        if not isinstance(file, (str, os.PathLike)) or Path(file) != target:
            return handle
        write = handle.write

        def faulty_write(data: Any) -> Any:
            if die:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(random.uniform(0, slow))
            return write(data)

        handle.write = faulty_write
        return handle

    builtins.open = opened


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--slow-write", type=float, default=0.0)
    parser.add_argument("--die-on-write", action="store_true")
    options = parser.parse_args()
    import django

    django.setup()
    from django.conf import settings

    from audit.chain import audit_append, audit_transaction
    from audit.checkpoints import audit_checkpoint

    if options.slow_write or options.die_on_write:
        _faulty_open(
            Path(settings.SETTLE_AUDIT_CHECKPOINT_FILE),
            slow=options.slow_write,
            die=options.die_on_write,
        )
    for number in range(options.rounds):
        with audit_transaction():
            audit_append(kind="test", data={"signer": os.getpid(), "n": number})
        checkpoint = audit_checkpoint()
        if checkpoint is not None:
            print(f"signed {checkpoint.number}", flush=True)


if __name__ == "__main__":
    main()
