"""The people page: supervisors see the people of their providers and end their sessions;
superusers deactivate; nobody else may do either."""

from __future__ import annotations

import re

import pytest
from allauth.mfa.models import Authenticator
from allauth.socialaccount.models import SocialAccount
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from audit.kinds import AuditKind
from audit.models import AuditEvent
from harness.accounts import PASSWORD
from tests.support.console import console_user

pytestmark = pytest.mark.django_db


def _signed_in(username: str) -> Client:
    client = Client()
    response = client.post("/login/", {"login": username, "password": PASSWORD})
    assert response.status_code == 302
    return client


def _people(response) -> list[str]:
    return re.findall(r'data-person="([^"]+)"', response.content.decode())


@pytest.fixture
def root(db) -> User:
    return User.objects.create_superuser("root", "root@example.com", PASSWORD)


def test_a_supervisor_sees_the_people_of_the_providers_they_supervise(
    signed_in, supervisor, operator, viewer, outsider, root
):
    response = signed_in(supervisor).get("/people/")
    assert response.status_code == 200
    assert _people(response) == ["olivia", "sam", "victor"]
    assert b'href="/people/" aria-current="page">People</a>' in response.content


def test_a_superuser_sees_everyone(signed_in, supervisor, operator, outsider, root):
    assert _people(signed_in(root).get("/people/")) == ["olivia", "oscar", "root", "sam"]


@pytest.mark.parametrize("who", ["operator", "viewer"])
def test_anyone_but_a_supervisor_is_refused_and_offered_no_link(request, signed_in, who):
    client = signed_in(request.getfixturevalue(who))
    assert client.get("/people/").status_code == 403
    assert b">People</a>" not in client.get("/").content
    me = request.getfixturevalue(who)
    assert client.post(f"/people/{me.pk}/end-sessions").status_code == 403


def test_an_anonymous_visitor_is_sent_to_sign_in(client, operator):
    assert client.get("/people/")["Location"] == "/login/?next=/people/"
    response = client.post(f"/people/{operator.pk}/end-sessions")
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_the_page_says_how_each_signs_in_and_what_they_have(
    signed_in, supervisor, operator, viewer
):
    _signed_in("olivia"), _signed_in("olivia")  # before a passkey would ask for it
    SocialAccount.objects.create(user=operator, provider="sso", uid="sub-olivia")
    Authenticator.objects.create(user=operator, type=Authenticator.Type.WEBAUTHN, data={})
    Authenticator.objects.create(user=viewer, type=Authenticator.Type.RECOVERY_CODES, data={})
    html = signed_in(supervisor).get("/people/").content.decode()
    olivia = html[html.index('data-person="olivia"') : html.index('data-person="sam"')]
    victor = html[html.index('data-person="victor"') :]
    assert ">directory<" in olivia and ">registered<" in olivia
    assert "data-sessions>2<" in olivia
    assert ">local<" in victor and ">none<" in victor and "data-sessions>0<" in victor


def test_the_list_costs_the_same_statements_however_many_people(signed_in, root, provider):
    client = signed_in(root)

    def statements() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get("/people/").status_code == 200
        return len(captured.captured_queries)

    console_user("a1", "operator", provider)
    client.get("/people/")
    few = statements()
    for n in range(2, 12):
        user = console_user(f"a{n}", "operator", provider)
        _signed_in(f"a{n}")
        SocialAccount.objects.create(user=user, provider="sso", uid=f"s{n}")
        Authenticator.objects.create(user=user, type=Authenticator.Type.WEBAUTHN, data={})
    assert statements() == few


def test_a_supervisor_ends_a_persons_sessions(supervisor, operator):
    first, second = _signed_in("olivia"), _signed_in("olivia")
    sam = _signed_in("sam")
    response = sam.post(f"/people/{operator.pk}/end-sessions", follow=True)
    assert b"Ended 2 sessions of olivia." in response.content
    for ended in (first, second):
        gone = ended.get("/")
        assert (gone.status_code, gone["Location"]) == (302, "/login/?next=/")
    assert sam.get("/").status_code == 200
    event = AuditEvent.objects.filter(kind=AuditKind.SESSIONS_ENDED).get()
    assert event.data == {
        "user": "olivia",
        "user_id": operator.pk,
        "sessions": 2,
        "reason": "ended",
    }
    assert "sam" in str(event.actor)


def test_a_person_outside_the_supervisors_providers_is_not_found(
    signed_in, supervisor, outsider, root
):
    client = signed_in(supervisor)
    assert client.post(f"/people/{outsider.pk}/end-sessions").status_code == 404
    assert client.post(f"/people/{root.pk}/end-sessions").status_code == 404
    assert client.post("/people/999999/end-sessions").status_code == 404


def test_ending_sessions_is_a_post_with_its_csrf_token(supervisor, operator):
    client = Client(enforce_csrf_checks=True)
    client.force_login(supervisor)
    assert client.get(f"/people/{operator.pk}/end-sessions").status_code == 405
    assert client.post(f"/people/{operator.pk}/end-sessions").status_code == 403
    assert not AuditEvent.objects.filter(kind=AuditKind.SESSIONS_ENDED).exists()


def test_only_a_superuser_deactivates_and_the_sessions_end_with_it(
    signed_in, supervisor, operator, root
):
    olivia = _signed_in("olivia")
    assert b">Deactivate<" not in signed_in(supervisor).get("/people/").content
    assert signed_in(supervisor).post(f"/people/{operator.pk}/deactivate").status_code == 403
    assert olivia.get("/").status_code == 200

    response = signed_in(root).post(f"/people/{operator.pk}/deactivate", follow=True)
    assert b"Deactivated olivia" in response.content
    operator.refresh_from_db()
    assert not operator.is_active
    assert olivia.get("/").status_code == 302
    event = AuditEvent.objects.filter(kind=AuditKind.SESSIONS_ENDED).get()
    assert (event.data["reason"], event.data["sessions"]) == ("deactivated", 1)
    assert "root" in str(event.actor)


def test_a_superuser_cannot_deactivate_themselves(signed_in, root):
    response = signed_in(root).post(f"/people/{root.pk}/deactivate", follow=True)
    assert b"You cannot deactivate yourself." in response.content
    root.refresh_from_db()
    assert root.is_active
