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
        ({"SETTLE_PROXY_COUNT": "0"}, "SETTLE_PROXY_COUNT=0 is below the minimum of 1"),
        ({"SETTLE_LOGIN_ADDRESS_FAILURE_LIMIT": "x"}, "SETTLE_LOGIN_ADDRESS_FAILURE_LIMIT='x'"),
        ({"SETTLE_LOGIN_FAILURE_LIMIT": "0"}, "SETTLE_LOGIN_FAILURE_LIMIT=0 is below the minimum"),
        ({"SETTLE_LOGIN_COOLOFF_MINUTES": "soon"}, "SETTLE_LOGIN_COOLOFF_MINUTES='soon' is not"),
        (
            {"SETTLE_WORKER_HEARTBEAT_SECONDS": "30", "SETTLE_LIVENESS_WORKER_SECONDS": "30"},
            "SETTLE_LIVENESS_WORKER_SECONDS must be longer than SETTLE_WORKER_HEARTBEAT_SECONDS",
        ),
        (
            {"SETTLE_SWEEP_SECONDS": "10", "SETTLE_LIVENESS_BEAT_SECONDS": "5"},
            "SETTLE_LIVENESS_BEAT_SECONDS must be longer than SETTLE_SWEEP_SECONDS",
        ),
        ({"SETTLE_CACHE_URL": "memcached://x"}, "SETTLE_CACHE_URL='memcached://x': use redis://"),
        (
            {"SETTLE_HOST_RATE_PER_SECOND": "10", "SETTLE_HOST_RATE_BURST": "5"},
            "SETTLE_HOST_RATE_BURST must be at least SETTLE_HOST_RATE_PER_SECOND",
        ),
        ({"SETTLE_REFUSALS_RECORDED_PER_MINUTE": "0"}, "SETTLE_REFUSALS_RECORDED_PER_MINUTE=0 is"),
        (
            {"SETTLE_WEBHOOK_TIMEOUT_SECONDS": "60"},
            "SETTLE_WEBHOOK_TIMEOUT_SECONDS=60 is above the maximum of 30",
        ),
        (
            {"SETTLE_WEBHOOK_TIMEOUT_SECONDS": "10", "SETTLE_WEBHOOK_LEASE_SECONDS": "10"},
            "SETTLE_WEBHOOK_LEASE_SECONDS=10 must exceed SETTLE_WEBHOOK_TIMEOUT_SECONDS=10",
        ),
        (
            {"SETTLE_OIDC_ISSUER": "https://id.example.com"},
            "SETTLE_OIDC_ISSUER is set: set SETTLE_OIDC_CLIENT_ID and _SECRET",
        ),
        ({"SETTLE_OIDC_ISSUER": "id.example.com"}, "SETTLE_OIDC_ISSUER='id.example.com' is not"),
        (
            {
                "SETTLE_HTTPS": "true",
                "SETTLE_OIDC_ISSUER": "http://id.example.com",
                "SETTLE_OIDC_CLIENT_ID": "settle",
                "SETTLE_OIDC_CLIENT_SECRET": "s",
            },
            "SETTLE_OIDC_ISSUER='http://id.example.com': SETTLE_HTTPS is on",
        ),
        (
            {"SETTLE_REQUIRE_PASSKEY_FOR": "supervisor,everyone"},
            "SETTLE_REQUIRE_PASSKEY_FOR='supervisor,everyone': name the roles",
        ),
        ({"SETTLE_OIDC_PROVIDERS": "Partner"}, "SETTLE_OIDC_PROVIDERS: 'Partner' is not a"),
        ({"SETTLE_OIDC_PROVIDERS": "partner"}, "set SETTLE_OIDC_PARTNER_ISSUER"),
        ({"SETTLE_OIDC_ROLE_MAP": "/nowhere/roles.toml"}, "SETTLE_OIDC_ROLE_MAP='/nowhere/"),
        (
            {"SETTLE_APPROVAL_NOTIFY_CONFIG": "/nowhere/apprise.yml"},
            "SETTLE_APPROVAL_NOTIFY_CONFIG='/nowhere/apprise.yml' is not a readable file",
        ),
        ({"SETTLE_APPROVAL_REMIND_MINUTES": "0"}, "SETTLE_APPROVAL_REMIND_MINUTES=0 is below"),
        ({"SETTLE_APPROVAL_ESCALATE_MINUTES": "soon"}, "SETTLE_APPROVAL_ESCALATE_MINUTES='soon'"),
        ({"SETTLE_APPROVAL_NOTIFY_SECONDS": "0"}, "SETTLE_APPROVAL_NOTIFY_SECONDS=0 is below"),
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


def test_processes_starting_at_once_all_read_the_one_secret_generated(tmp_path):
    # A first start: web workers, Celery and beat generate the secret at the same moment.
    environment = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DEBUG")}
    environment["SETTLE_VAR_DIR"] = str(tmp_path / "var")
    show = "from django.conf import settings as s; print(s.SECRET_KEY)"
    starts = [
        subprocess.Popen(
            [sys.executable, "manage.py", "shell", "-c", show],
            cwd=ROOT,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    keys = []
    for start in starts:
        out, err = start.communicate(timeout=120)
        assert start.returncode == 0, err
        keys.append(out.strip().splitlines()[-1])
    written = (tmp_path / "var" / "secret_key").read_text()
    assert len(written) >= 50
    assert keys == [written] * 8
    assert sorted(p.name for p in (tmp_path / "var").iterdir() if "secret_key" in p.name) == [
        "secret_key"
    ]


def test_an_empty_secret_file_fails_at_start_up_with_a_clear_message(tmp_path):
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "secret_key").write_text("")
    result = _start({}, tmp_path)
    assert result.returncode != 0
    assert "secret_key is empty" in result.stderr


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


def test_celery_is_at_least_once_and_redis_never_redelivers_a_live_task():
    """The settings the background recovery's safety argument rests on."""
    from recovery.models import Provider
    from settle.celery import app

    conf = app.conf
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.worker_prefetch_multiplier == 1
    assert not conf.task_always_eager  # tasks never run inside a web request
    assert conf.task_soft_time_limit < conf.task_time_limit
    # The longest lookup (the largest provider timeout the database allows) ends well
    # inside the soft limit.
    [timeout_check] = [c for c in Provider._meta.constraints if c.name == "provider_timeout_range"]
    assert "60" in str(timeout_check.condition) and conf.task_soft_time_limit > 60 + 5
    schedule = conf.beat_schedule
    assert schedule["sweep"]["task"] == "recovery.tasks.sweep"
    assert schedule["audit-checkpoint"]["schedule"] == 60.0
    assert schedule["approval-notices"]["task"] == "monitoring.tasks.approval_notices"
    assert schedule["approval-notices"]["schedule"] == 60.0
    app.loader.import_default_modules()  # what a worker does at start: finds the tasks
    assert set(app.tasks) >= {
        "recovery.tasks.sweep",
        "recovery.tasks.lookup_attempt",
        "audit.tasks.audit_checkpoint",
        "bulk.tasks.bulk_chunk",
        "bulk.tasks.bulk_publish",
        "console.tasks.audit_export",
    }
    # Beat publishes only what a worker knows by that name.
    assert {entry["task"] for entry in schedule.values()} <= set(app.tasks)


def test_a_redis_broker_gets_a_visibility_timeout_longer_than_any_task(tmp_path):
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "print(s.CELERY_BROKER_TRANSPORT_OPTIONS['visibility_timeout'], s.CELERY_TASK_TIME_LIMIT)"
    )
    environment = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    environment |= {
        "SETTLE_VAR_DIR": str(tmp_path / "var"),
        "CELERY_BROKER_URL": "redis://127.0.0.1:6379/0",
        "DJANGO_SETTINGS_MODULE": "settle.settings",
    }
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=environment, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    visibility, hard_limit = map(int, result.stdout.split())
    lookup_lease = 60 + 5  # the longest provider timeout plus the lease margin
    assert visibility > hard_limit and visibility > lookup_lease


def test_prepared_statements_are_on_for_postgresql_and_can_be_turned_off(monkeypatch):
    """On by default; off for a pooler that cannot keep them (transaction-mode PgBouncer)."""
    from settle.settings_database import _database, _db_bounds

    monkeypatch.setenv("DATABASE_URL", "postgres://settle@db:5432/settle")
    monkeypatch.delenv("SETTLE_DB_PREPARED_STATEMENTS", raising=False)
    jit_off = {"connect_timeout": 5, "options": " ".join(["-c jit=off", *_db_bounds()])}
    assert _database()["OPTIONS"] == {
        "server_side_binding": True,
        "prepare_threshold": 5,
        **jit_off,
    }
    monkeypatch.setenv("SETTLE_DB_PREPARED_STATEMENTS", "off")
    assert _database()["OPTIONS"] == jit_off


def test_postgresql_connections_compile_nothing_unless_the_url_says(monkeypatch):
    """No JIT: the queue's counts spent up to a second compiling (docs/benchmarks.md)."""
    from settle.settings_database import _database

    monkeypatch.setenv("DATABASE_URL", "postgres://settle@db:5432/settle")
    assert _database()["OPTIONS"]["options"].startswith("-c jit=off ")
    monkeypatch.setenv("DATABASE_URL", "postgres://settle@db:5432/settle?options=-c%20jit%3Don")
    # The URL's own options come last, and PostgreSQL applies the last of each setting.
    assert _database()["OPTIONS"]["options"].endswith(" -c jit=on")


def _settings_printed(code: str, environment: dict[str, str], *command: str) -> str:
    """What ``code`` prints in a Python started with ``command`` in ``environment``."""
    result = subprocess.run(
        [sys.executable, *command, "-c", code],
        cwd=ROOT,
        env={"DJANGO_SETTINGS_MODULE": "settle.settings", **environment},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _session_settings(env: dict[str, str], tmp_path: Path, *command: str) -> list[str]:
    """The bounds a process started with ``command`` puts on its PostgreSQL sessions."""
    code = (
        "from django.conf import settings as s; "
        "print(s.DATABASES['default']['CONN_HEALTH_CHECKS'], "
        "s.DATABASES['default']['OPTIONS']['options'])"
    )
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SETTLE_DB_")}
    environment |= {
        "SETTLE_VAR_DIR": str(tmp_path / "var"),
        "DATABASE_URL": "postgres://settle@db:5432/settle",
        **env,
    }
    return _settings_printed(code, environment, *command).split()


def test_the_web_and_workers_bound_statements_and_commands_take_their_own_bound(tmp_path):
    """gunicorn and Celery (any program but a management command) get the web's bounds."""
    served = _session_settings({}, tmp_path)
    assert served[0] == "True"  # a connection kept across requests is checked first
    assert "statement_timeout=30000" in served and "lock_timeout=10000" in served
    assert "idle_in_transaction_session_timeout=120000" in served
    tight = _session_settings(
        {"SETTLE_DB_STATEMENT_TIMEOUT_MS": "1500", "SETTLE_DB_LOCK_TIMEOUT_MS": "250"}, tmp_path
    )
    assert "statement_timeout=1500" in tight and "lock_timeout=250" in tight
    # A management command (migrate, verify_audit, the benchmarks) is not cut by them.
    command = _session_settings({}, tmp_path, "manage.py", "shell")
    assert "statement_timeout=0" in command and "lock_timeout=0" in command
    bounded = _session_settings(
        {"SETTLE_DB_COMMAND_STATEMENT_TIMEOUT_MS": "600000"}, tmp_path, "manage.py", "shell"
    )
    assert "statement_timeout=600000" in bounded


def test_a_redis_broker_call_is_bounded_and_a_publish_gives_up_at_once(tmp_path):
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "o = s.CELERY_BROKER_TRANSPORT_OPTIONS; "
        "print(o['socket_timeout'], o['socket_connect_timeout'], "
        "s.CELERY_TASK_PUBLISH_RETRY_POLICY['max_retries'])"
    )
    environment = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    environment |= {
        "SETTLE_VAR_DIR": str(tmp_path / "var"),
        "CELERY_BROKER_URL": "redis://127.0.0.1:6379/0",
        "DJANGO_SETTINGS_MODULE": "settle.settings",
    }
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=environment, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1.0", "1.0", "0"]


@pytest.mark.parametrize(
    ("env", "cache"),
    [
        ({"CELERY_BROKER_URL": "redis://127.0.0.1:6379/3"}, "RedisCache redis://127.0.0.1:6379/3"),
        (
            {
                "CELERY_BROKER_URL": "redis://127.0.0.1:6379/3",
                "SETTLE_CACHE_URL": "redis://c:6379/1",
            },
            "RedisCache redis://c:6379/1",
        ),
        ({"CELERY_BROKER_URL": "filesystem://"}, "FileBasedCache {var}/cache"),
    ],
)
def test_the_rate_limit_is_counted_in_the_brokers_redis_unless_told(env, cache, tmp_path):
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "c = s.CACHES['default']; print(c['BACKEND'].rsplit('.', 1)[1], c['LOCATION'])"
    )
    environment = {
        k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "SETTLE_CACHE_URL"}
    }
    environment |= {
        "SETTLE_VAR_DIR": str(tmp_path / "var"),
        "DJANGO_SETTINGS_MODULE": "settle.settings",
        **env,
    }
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=environment, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == cache.format(var=tmp_path / "var")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[groups."ops"]\nadmin = ["*"]', "\"ops\": 'admin' is not a role"),
        ('[groups."ops"]\noperator = "orders"', '."ops".operator is not a list of provider'),
        ("[groups\n", "roles.toml: "),
        ('[people."ops"]\nviewer = ["*"]', "unknown tables ['people']"),
        ('[idp.partner.teams."ops"]\nviewer = ["*"]', "[idp.partner] holds only a groups table"),
    ],
)
def test_a_mistake_in_the_role_map_stops_start_up_saying_where(text, message, tmp_path):
    role_map = tmp_path / "roles.toml"
    role_map.write_text(text)
    result = _start({"SETTLE_OIDC_ROLE_MAP": str(role_map)}, tmp_path)
    assert result.returncode != 0
    assert message in result.stderr


def test_each_identity_provider_is_read_from_its_own_names(tmp_path):
    script = (
        "import django; django.setup(); from django.conf import settings; "
        "print([(p.id, p.issuer, p.client_id, p.label, p.groups_claim, p.allowed_groups) "
        "for p in settings.SETTLE_OIDC]); "
        "print([a['provider_id'] for a in "
        "settings.SOCIALACCOUNT_PROVIDERS['openid_connect']['APPS']])"
    )
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SETTLE_OIDC")}
    environment |= {
        "SETTLE_VAR_DIR": str(tmp_path / "var"),
        "SETTLE_OIDC_ISSUER": "https://id.example.com/",
        "SETTLE_OIDC_CLIENT_ID": "settle",
        "SETTLE_OIDC_CLIENT_SECRET": "s",
        "SETTLE_OIDC_ALLOWED_GROUPS": "ops, leads,",
        "SETTLE_OIDC_LABEL": "Sign in with Okta",
        "SETTLE_OIDC_PROVIDERS": "partner-co",
        "SETTLE_OIDC_PARTNER_CO_ISSUER": "https://partner.example.com",
        "SETTLE_OIDC_PARTNER_CO_CLIENT_ID": "settle-p",
        "SETTLE_OIDC_PARTNER_CO_CLIENT_SECRET": "p",
        "SETTLE_OIDC_PARTNER_CO_GROUPS_CLAIM": "roles",
    }
    providers, apps = _settings_printed(script, environment).splitlines()
    assert providers == str(
        [
            (
                "sso",
                "https://id.example.com",
                "settle",
                "Sign in with Okta",
                "groups",
                ("ops", "leads"),
            ),
            (
                "partner-co",
                "https://partner.example.com",
                "settle-p",
                "Sign in with single sign-on",
                "roles",
                (),
            ),
        ]
    )
    assert apps == str(["sso", "partner-co"])


def test_a_readable_apprise_configuration_starts(tmp_path):
    config = tmp_path / "apprise.yml"
    config.write_text("urls:\n  - json://127.0.0.1:9/:\n      tag: approvers\n")
    result = _start({"SETTLE_APPROVAL_NOTIFY_CONFIG": str(config)}, tmp_path)
    assert result.returncode == 0, result.stderr
    # A folder is not a configuration file.
    result = _start({"SETTLE_APPROVAL_NOTIFY_CONFIG": str(tmp_path)}, tmp_path)
    assert "is not a readable file" in result.stderr


def test_the_status_pages_older_beat_threshold_name_is_still_read(tmp_path):
    """``SETTLE_STATUS_SWEEP_STALE_SECONDS`` became ``SETTLE_LIVENESS_BEAT_SECONDS``."""
    environment = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "DEBUG"}}
    environment |= {
        "SETTLE_VAR_DIR": str(tmp_path / "var"),
        "SETTLE_STATUS_SWEEP_STALE_SECONDS": "77",
    }
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', "
            "'settle.settings'); django.setup(); from django.conf import settings; "
            "print(settings.SETTLE_LIVENESS_BEAT_SECONDS)",
        ],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == "77", done.stderr


def test_the_tests_quick_password_hashes_are_checked_by_the_production_hasher(settings):
    """tests/support/hashers.py: a hash the tests make at one iteration signs in at a
    server started with the production settings (which set no PASSWORD_HASHERS of their
    own), and is upgraded to the production iterations there."""
    from django.conf import global_settings
    from django.contrib.auth.hashers import check_password, identify_hasher, make_password

    from tests.support.hashers import QuickPBKDF2PasswordHasher

    quick = make_password("a-password", hasher=QuickPBKDF2PasswordHasher())
    assert quick.startswith("pbkdf2_sha256$1$")
    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS
    assert check_password("a-password", quick)
    assert not check_password("another", quick)
    assert identify_hasher(quick).must_update(quick)
