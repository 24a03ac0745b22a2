"""The documented production configuration passes ``check --deploy``; logs carry request ids."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import DatabaseError
from django.test import Client

from settle.logs import JsonFormatter, RequestIdFilter

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = {
    "DEBUG": "false",
    "SECRET_KEY": "a-production-secret-key-that-is-long-and-random-0123456789",
    "ALLOWED_HOSTS": "settle.example.com",
    "SETTLE_HTTPS": "true",
}


def _manage(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECRET_KEY"}}
    environment |= {"SETTLE_VAR_DIR": str(tmp_path / "var"), **env}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_documented_production_settings_pass_check_deploy(tmp_path):
    result = _manage(tmp_path, PRODUCTION, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_without_https_check_deploy_names_what_is_missing(tmp_path):
    env = {k: v for k, v in PRODUCTION.items() if k != "SETTLE_HTTPS"}
    result = _manage(tmp_path, env, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode != 0
    for warning in ("W004", "W008", "W012", "W016"):
        assert warning in result.stderr + result.stdout


def test_https_settings_come_from_the_environment(tmp_path):
    show = (
        "from django.conf import settings as s; print(s.SESSION_COOKIE_SECURE, "
        "s.CSRF_COOKIE_SECURE, s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS, "
        "s.SECURE_PROXY_SSL_HEADER)"
    )
    on = _manage(tmp_path, PRODUCTION, "shell", "-c", show).stdout.strip().splitlines()[-1]
    assert on == "True True True 31536000 ('HTTP_X_FORWARDED_PROTO', 'https')"
    off = _manage(tmp_path, {"SECURE_HSTS_SECONDS": "60"}, "shell", "-c", show)
    off = off.stdout.strip().splitlines()[-1]
    assert off == "False False False 60 None"


# -- request ids and logging ---------------------------------------------------------


@pytest.mark.django_db
def test_every_answer_carries_a_request_id_and_a_sane_one_given_is_kept(client):
    made = client.get("/healthz")["X-Request-ID"]
    assert len(made) == 32
    assert client.get("/healthz", HTTP_X_REQUEST_ID="proxy-42")["X-Request-ID"] == "proxy-42"
    odd = client.get("/healthz", HTTP_X_REQUEST_ID="a b\tc")["X-Request-ID"]
    assert odd != "a b\tc" and len(odd) == 32


@pytest.mark.django_db
def test_a_database_error_is_logged_with_the_request_id(host_api, provider, monkeypatch, caplog):
    from recovery.services import registration

    def broken(**kwargs):
        raise DatabaseError("the disk is on fire")

    monkeypatch.setattr(registration, "operation_register", broken)
    body = {"key": "op-1", "action": "payment.send", "provider": "orders", "params": {}}
    with caplog.at_level(logging.ERROR, logger="settle.api"):
        response = host_api.post("/api/v1/operations", body)
    assert response.status_code == 503
    (record,) = [r for r in caplog.records if r.name == "settle.api"]
    RequestIdFilter().filter(record)
    assert record.request_id == response["X-Request-ID"]
    assert "the disk is on fire" in record.exc_text or "the disk is on fire" in str(record.exc_info)


@pytest.mark.django_db
def test_an_unexpected_error_answers_500_json_and_is_logged_with_the_request_id(
    host_api, provider, monkeypatch, caplog
):
    from recovery.services import registration

    def broken(**kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(registration, "operation_register", broken)
    host_api.client = Client(raise_request_exception=False)
    body = {"key": "op-1", "action": "payment.send", "provider": "orders", "params": {}}
    with caplog.at_level(logging.ERROR, logger="django.request"):
        response = host_api.post("/api/v1/operations", body)
    assert response.status_code == 500
    assert response.json() == {"error": "internal_error", "message": "unexpected error"}
    (record,) = [r for r in caplog.records if r.name == "django.request"]
    RequestIdFilter().filter(record)
    assert record.request_id == response["X-Request-ID"]


def test_json_log_lines_are_json_objects_with_the_request_id():
    record = logging.LogRecord("settle.api", logging.ERROR, __file__, 1, "boom %s", ("x",), None)
    record.request_id = "req-1"
    line = json.loads(JsonFormatter().format(record))
    assert (line["level"], line["logger"], line["request_id"], line["message"]) == (
        "ERROR",
        "settle.api",
        "req-1",
        "boom x",
    )
