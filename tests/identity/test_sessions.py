"""Sessions that end: the maximum age fixed at sign-in, the idle timeout, the activity
written at most once a minute, a user's sessions ended, and a deactivated user's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import time_machine
from allauth.usersessions.models import UserSession
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext, override_settings
from django.utils import timezone
from guardian.models import UserObjectPermission

from audit.kinds import AuditKind
from audit.models import AuditEvent
from common.actors import Actor
from harness.accounts import PASSWORD
from identity.sessions import SEEN_AT, SIGNED_IN_AT, sessions_end
from tests.support.console import console_user

pytestmark = pytest.mark.django_db

START = timezone.now().replace(microsecond=0)


def _shape(sql: str) -> str:
    """A statement without its literals: the clock and the session key differ."""
    return re.sub(r"'[^']*'", "'?'", sql)


def _signed_in(username: str) -> Client:
    client = Client()
    response = client.post("/login/", {"login": username, "password": PASSWORD})
    assert response.status_code == 302, response.content[:500]
    return client


def _signed_out(client: Client) -> bool:
    response = client.get("/")
    return response.status_code == 302 and response["Location"].startswith("/login/")


def test_a_session_ends_at_its_maximum_age_from_sign_in_however_busy(provider):
    console_user("olivia", "operator", provider)
    with time_machine.travel(START, tick=False) as clock:
        client = _signed_in("olivia")
        session = client.session
        assert session.get_expiry_date() == START + timedelta(minutes=720)
        assert not session.get_expire_at_browser_close()
        for _ in range(12 * 4 - 1):  # a request every quarter of an hour: never idle
            clock.shift(timedelta(minutes=15))
            assert client.get("/").status_code == 200
        # Every write kept the instant of sign-in's expiry: nothing slid it.
        assert client.session.get_expiry_date() == START + timedelta(minutes=720)
        clock.shift(timedelta(minutes=15))
        assert _signed_out(client)


def test_an_idle_session_is_signed_out_after_the_timeout_not_before(provider):
    console_user("olivia", "operator", provider)
    with time_machine.travel(START, tick=False) as clock:
        client = _signed_in("olivia")
        clock.shift(timedelta(minutes=29, seconds=59))
        assert client.get("/").status_code == 200
        clock.shift(timedelta(minutes=30))
        assert _signed_out(client)
    event = AuditEvent.objects.filter(kind=AuditKind.SIGNED_OUT).get()
    assert (event.data["user"], event.data["reason"]) == ("olivia", "idle")


@override_settings(SETTLE_SESSION_IDLE_MINUTES=5)
def test_the_idle_timeout_is_a_setting(provider):
    console_user("olivia", "operator", provider)
    with time_machine.travel(START, tick=False) as clock:
        client = _signed_in("olivia")
        clock.shift(timedelta(minutes=5))
        assert _signed_out(client)


def test_activity_is_written_at_most_once_a_minute(provider, operator):
    with time_machine.travel(START, tick=False) as clock:
        client = _signed_in("olivia")

        def statements() -> list[str]:
            with CaptureQueriesContext(connection) as captured:
                assert client.get("/").status_code == 200
            return [_shape(q["sql"]) for q in captured.captured_queries]

        client.get("/")  # the first page after sign-in reads what later ones have kept
        clock.shift(timedelta(seconds=30))
        quiet = statements()
        clock.shift(timedelta(seconds=29))
        assert statements() == quiet
        clock.shift(timedelta(seconds=2))  # a minute since sign-in: written
        written = statements()
        clock.shift(timedelta(seconds=59))
        assert statements() == quiet
        assert client.session[SEEN_AT] == int((START + timedelta(seconds=61)).timestamp())
        updates = [sql for sql in written if sql.startswith('UPDATE "django_session"')]
        assert len(updates) == 1
        assert [sql for sql in written if "SAVEPOINT" not in sql and sql not in updates] == quiet


def test_the_middleware_adds_no_statement_to_a_page_within_the_minute(provider, operator):
    """The queue, twice within a minute: the same statements with or without it."""

    def second_visit() -> list[str]:
        with time_machine.travel(START, tick=False) as clock:
            client = _signed_in("olivia")
            client.get("/")
            clock.shift(timedelta(seconds=20))
            with CaptureQueriesContext(connection) as captured:
                assert client.get("/").status_code == 200
        return [_shape(q["sql"]) for q in captured.captured_queries]

    with_it = second_visit()
    from django.conf import settings

    without = [m for m in settings.MIDDLEWARE if m != "identity.sessions.IdleSignOutMiddleware"]
    with override_settings(MIDDLEWARE=without):
        assert second_visit() == with_it


def test_usersessions_writes_a_row_at_sign_in_and_nothing_per_request(provider, operator):
    with time_machine.travel(START, tick=False) as clock:
        client = _signed_in("olivia")
        (row,) = UserSession.objects.filter(user=operator)
        assert row.session_key == client.session.session_key
        clock.shift(timedelta(seconds=10))
        with CaptureQueriesContext(connection) as captured:
            client.get("/")
        assert not any("usersessions" in q["sql"] for q in captured.captured_queries)
        assert UserSession.objects.get().last_seen_at == row.last_seen_at


def test_the_admins_sign_in_is_a_session_that_can_be_ended():
    User.objects.create_superuser("root", "root@example.com", PASSWORD)
    client = Client()
    response = client.post("/admin/login/", {"username": "root", "password": PASSWORD})
    assert response.status_code == 302
    assert UserSession.objects.filter(user__username="root").count() == 1
    assert client.session[SIGNED_IN_AT]


def test_ending_a_users_sessions_sends_each_to_sign_in(provider, operator):
    first, second = _signed_in("olivia"), _signed_in("olivia")
    ended = sessions_end(user=operator, actor=Actor.system("test"), reason="ended")
    assert ended == 2
    assert _signed_out(first) and _signed_out(second)
    event = AuditEvent.objects.filter(kind=AuditKind.SESSIONS_ENDED).get()
    assert event.data | {"reason": "ended"} == {
        "user": "olivia",
        "user_id": operator.pk,
        "sessions": 2,
        "reason": "ended",
    }


def test_deactivating_a_user_ends_their_sessions_at_once(provider, operator):
    client = _signed_in("olivia")
    operator.is_active = False
    operator.save()
    assert not UserSession.objects.filter(user=operator).exists()
    assert _signed_out(client)
    event = AuditEvent.objects.filter(kind=AuditKind.SESSIONS_ENDED).get()
    assert (event.data["sessions"], event.data["reason"]) == (1, "deactivated")


def test_an_inactive_users_session_without_its_row_is_refused(provider, operator):
    """A session allauth.usersessions never knew (force_login, or from before it):
    deactivation cannot find it, and the authentication middleware refuses it anyway."""
    client = Client()
    client.force_login(operator)
    assert client.get("/").status_code == 200
    User.objects.filter(pk=operator.pk).update(is_active=False)  # no signal either
    assert _signed_out(client)


def test_saving_an_active_user_ends_nothing(provider, operator):
    client = _signed_in("olivia")
    operator.first_name = "Olivia"
    operator.save()
    assert client.get("/").status_code == 200
    assert not AuditEvent.objects.filter(kind=AuditKind.SESSIONS_ENDED).exists()


def test_a_lost_role_applies_to_an_open_session_at_its_next_request(provider, operator, stuck):
    stuck.unknown("op-1")
    client = _signed_in("olivia")
    assert client.get("/operations/op-1/").status_code == 200
    UserObjectPermission.objects.filter(user=operator).delete()
    assert client.get("/operations/op-1/").status_code == 404
    assert b"op-1" not in client.get("/").content


def _settings_shown(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    show = (
        "from django.conf import settings as s; "
        "print(s.SESSION_COOKIE_AGE, s.SETTLE_SESSION_IDLE_MINUTES, s.SESSION_SAVE_EVERY_REQUEST)"
    )
    environment = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "DATABASE_URL"}}
    return subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", show],
        cwd=Path(__file__).resolve().parents[2],
        env=environment | {"SETTLE_VAR_DIR": str(tmp_path / "var"), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_session_lengths_come_from_the_environment(tmp_path):
    default = _settings_shown({}, tmp_path)
    assert default.stdout.strip().splitlines()[-1] == "43200 30 False"
    env = {"SETTLE_SESSION_MAX_AGE_MINUTES": "60", "SETTLE_SESSION_IDLE_MINUTES": "10"}
    assert _settings_shown(env, tmp_path).stdout.strip().splitlines()[-1] == "3600 10 False"
    bad = _settings_shown({"SETTLE_SESSION_IDLE_MINUTES": "0"}, tmp_path)
    assert bad.returncode != 0
    assert "SETTLE_SESSION_IDLE_MINUTES=0 is below the minimum of 1" in bad.stderr


def test_beat_clears_ended_sessions_and_their_rows_and_keeps_the_open_ones(provider):
    from django.contrib.sessions.models import Session

    from identity.tasks import sessions_clear

    console_user("olivia", "operator", provider)
    with time_machine.travel(START, tick=False) as clock:
        old = _signed_in("olivia")
        clock.shift(timedelta(minutes=600))
        kept = _signed_in("olivia")
        clock.shift(timedelta(minutes=121))  # the first is past its maximum age
        assert sessions_clear() == (1, 1)
    assert list(Session.objects.values_list("session_key", flat=True)) == [kept.session.session_key]
    assert list(UserSession.objects.values_list("session_key", flat=True)) == [
        kept.session.session_key
    ]
    assert old.session.session_key not in {s.session_key for s in UserSession.objects.all()}
    assert sessions_clear() == (0, 0)
