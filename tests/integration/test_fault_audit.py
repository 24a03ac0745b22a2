"""The checkpoint file's faults: its storage gone for a while, signers racing, a kill.

Racing and killed signers are processes of their own (``tests/procs/audit_signer.py``)
on this test's PostgreSQL database; the file's storage is taken away by replacing its
folder with a file or renaming the folder away, as a vanished mount would leave it.
Every process has a bounded wait.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client

from audit.chain import audit_append, audit_transaction
from audit.models import AuditAlarm, AuditCheckpoint
from audit.verify_walk import audit_verify
from tests.support.celery_fixtures import test_database_url

pytestmark = pytest.mark.django_db(transaction=True)

REPO_ROOT = Path(__file__).resolve().parents[2]
SIGNER = REPO_ROOT / "tests" / "procs" / "audit_signer.py"
WAIT = 60.0


@pytest.fixture
def postgres() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL: signers in processes of their own share its locks")


def _event(n: int = 0) -> None:
    with audit_transaction():
        audit_append(kind="test", data={"n": n})


def _problem() -> str | None:
    found = next(iter(audit_verify()), None)
    return None if found is None else str(found)


def _signer(*args: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "DATABASE_URL": test_database_url(),
        "SETTLE_AUDIT_CHECKPOINT_FILE": str(settings.SETTLE_AUDIT_CHECKPOINT_FILE),
        "SETTLE_AUDIT_KEY": settings.SETTLE_AUDIT_KEY,
    }
    return subprocess.Popen(
        [sys.executable, str(SIGNER), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _storage_gone(folder: Path, how: str) -> Path:
    away = folder.with_name(folder.name + "-away")
    folder.rename(away)
    if how == "a file in its place":
        folder.write_text("not a folder\n")
    return away


def _storage_back(folder: Path, away: Path) -> None:
    if folder.is_file():
        folder.unlink()
    away.rename(folder)


@pytest.mark.parametrize("how", ["a file in its place", "renamed away"])
def test_checkpoint_file_storage_lost_then_restored_raises_an_alarm_and_is_repaired(
    how, admin_user
):
    path = Path(settings.SETTLE_AUDIT_CHECKPOINT_FILE)
    _event(0)
    call_command("audit_checkpoint")
    away = _storage_gone(path.parent, how)
    _event(1)
    with pytest.raises(CommandError, match="not in the checkpoint file"):
        call_command("audit_checkpoint")
    alarm = AuditAlarm.objects.get(resolved_at__isnull=True)
    assert alarm.kind == AuditAlarm.Kind.CHECKPOINT_FILE
    assert "checkpoint file" in alarm.reason
    client = Client()
    client.force_login(admin_user)
    page = client.get("/status/").content.decode()
    assert "checkpoint file incomplete" in page or "checkpoint_file" in page
    _storage_back(path.parent, away)
    _event(2)
    call_command("audit_checkpoint")
    assert AuditCheckpoint.objects.count() == 3
    assert _problem() is None
    call_command("verify_audit", "--no-checkpoint")
    alarm.refresh_from_db()
    assert alarm.resolved_at is not None
    assert alarm.resolution.startswith("repaired: the lines of checkpoint #2")
    assert len(path.read_text("utf-8").splitlines()) == 3


def test_concurrent_signers_on_a_slow_disk_leave_a_checkpoint_file_that_verifies(postgres):
    _event(0)
    signers = [_signer("--rounds", "5", "--slow-write", "0.3") for _ in range(3)]
    for signer in signers:
        output, _ = signer.communicate(timeout=WAIT)
        assert signer.returncode == 0, output
    assert AuditCheckpoint.objects.count() >= 4
    assert _problem() is None


def test_a_signer_killed_between_commit_and_append_is_repaired_by_the_next_checkpoint(
    postgres,
):
    _event(0)
    call_command("audit_checkpoint")
    killed = _signer("--rounds", "1", "--die-on-write")
    killed.communicate(timeout=WAIT)
    assert killed.returncode == -9
    assert AuditCheckpoint.objects.count() == 2  # committed, and its line never written
    following = _signer("--rounds", "1")
    output, _ = following.communicate(timeout=WAIT)
    assert following.returncode == 0, output
    assert AuditCheckpoint.objects.count() == 3
    assert _problem() is None


def test_a_line_cut_short_is_removed_and_written_whole(tmp_path):
    path = Path(settings.SETTLE_AUDIT_CHECKPOINT_FILE)
    _event(0)
    call_command("audit_checkpoint")
    _event(1)
    call_command("audit_checkpoint")
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) - 40])  # the disk filled while #2 was written
    shutil.copy(path, tmp_path / "cut.jsonl")
    _event(2)
    call_command("audit_checkpoint")
    assert _problem() is None
    assert path.read_bytes().startswith(whole)
