"""Settings come from the environment; a bad value stops start-up with a clear message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _start(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "DEBUG"}}
    environment |= {"SETTLE_VAR_DIR": str(tmp_path / "var"), **env}
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DEBUG": "maybe"}, "DEBUG='maybe' is not a boolean"),
        ({"SECRET_KEY": "short"}, "SECRET_KEY must be at least 32 characters"),
        ({"DATABASE_URL": "mysql://root@127.0.0.1/x"}, "is not supported"),
        ({"DATABASE_URL": "nonsense"}, "DATABASE_URL"),
        ({"SETTLE_MAX_BODY_BYTES": "lots"}, "SETTLE_MAX_BODY_BYTES='lots' is not an integer"),
        ({"SETTLE_LOGIN_FAILURE_LIMIT": "0"}, "SETTLE_LOGIN_FAILURE_LIMIT=0 is below the minimum"),
        ({"SETTLE_LOGIN_COOLOFF_MINUTES": "soon"}, "SETTLE_LOGIN_COOLOFF_MINUTES='soon' is not"),
    ],
)
def test_bad_value_fails_at_start_up_with_a_clear_message(env, message, tmp_path):
    result = _start(env, tmp_path)
    assert result.returncode != 0
    assert message in result.stderr


def test_secret_key_is_generated_once_into_var(tmp_path):
    assert _start({}, tmp_path).returncode == 0
    key_file = tmp_path / "var" / "secret_key"
    first = key_file.read_text()
    assert len(first) >= 50
    assert _start({}, tmp_path).returncode == 0
    assert key_file.read_text() == first
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"


def test_the_sign_in_throttle_comes_from_the_environment(tmp_path):
    environment = {k: v for k, v in os.environ.items() if k != "DEBUG"}
    environment |= {
        "SETTLE_VAR_DIR": str(tmp_path / "var"),
        "SETTLE_LOGIN_FAILURE_LIMIT": "3",
        "SETTLE_LOGIN_COOLOFF_MINUTES": "60",
    }
    show = "from django.conf import settings as s; print(s.AXES_FAILURE_LIMIT, s.AXES_COOLOFF_TIME)"
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", show],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.strip().splitlines()[-1] == "3 1:00:00"
