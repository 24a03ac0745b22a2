"""Sign-in and sign-out: every console page needs a signed-in user; failures are throttled."""

from __future__ import annotations

import pytest
import time_machine
from axes.models import AccessAttempt, AccessLog
from django.test import Client

from harness.accounts import PASSWORD
from tests.support.console import console_user

pytestmark = pytest.mark.django_db

CONSOLE_PAGES = ["/", "/operations/op-1/"]


@pytest.mark.parametrize("path", CONSOLE_PAGES)
def test_an_anonymous_visitor_is_sent_to_sign_in_and_back(client, path):
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"] == f"/login/?next={path}"


def test_signing_in_lands_on_the_page_asked_for(client, provider):
    console_user("olivia", "operator", provider)
    page = client.get("/login/?next=/")
    assert page.status_code == 200
    assert b'name="password"' in page.content
    response = client.post("/login/", {"login": "olivia", "password": PASSWORD, "next": "/"})
    assert response.status_code == 302
    assert response["Location"] == "/"
    assert client.get("/").status_code == 200


def test_a_wrong_password_is_refused_with_a_message(client):
    console_user("olivia")
    response = client.post("/login/", {"login": "olivia", "password": "wrong"})
    assert response.status_code == 200
    assert b"username and/or password you specified are not correct" in response.content
    assert client.get("/").status_code == 302


def test_a_signed_in_user_asking_for_sign_in_goes_to_the_queue(client):
    client.force_login(console_user("olivia"))
    response = client.get("/login/")
    assert (response.status_code, response["Location"]) == (302, "/")


def test_sign_in_answers_405_to_other_methods(client):
    assert client.put("/login/").status_code == 405


def test_sign_in_without_a_csrf_token_is_refused():
    console_user("olivia")
    client = Client(enforce_csrf_checks=True)
    response = client.post("/login/", {"login": "olivia", "password": PASSWORD})
    assert response.status_code == 403
    assert "_auth_user_id" not in client.session


def _fail(client: Client, username: str, times: int) -> None:
    for _ in range(times):
        response = client.post("/login/", {"login": username, "password": "wrong"})
        assert response.status_code == 200


def test_repeated_failures_lock_the_username_from_that_address_for_the_cool_off(settings):
    assert settings.AXES_FAILURE_LIMIT == 5
    console_user("olivia")
    console_user("victor")
    client = Client(REMOTE_ADDR="203.0.113.7")
    with time_machine.travel("2026-06-01 12:00:00Z", tick=False):
        _fail(client, "olivia", 4)
        # One more failure reaches the limit; from then on even the right password is
        # refused, without being checked.
        response = client.post("/login/", {"login": "olivia", "password": "wrong"})
        assert response.status_code == 429
        right = client.post("/login/", {"login": "olivia", "password": PASSWORD})
        assert right.status_code == 429
        assert b"Too many failed sign-ins" in right.content
        assert b"15 min" in right.content
        assert "_auth_user_id" not in client.session
        # Neither a colleague at the same address nor the same user elsewhere is locked.
        other_user = client.post("/login/", {"login": "victor", "password": PASSWORD})
        assert other_user.status_code == 302
        elsewhere = Client(REMOTE_ADDR="198.51.100.2")
        assert (
            elsewhere.post("/login/", {"login": "olivia", "password": PASSWORD}).status_code == 302
        )
    with time_machine.travel("2026-06-01 12:16:00Z", tick=False):
        client = Client(REMOTE_ADDR="203.0.113.7")
        response = client.post("/login/", {"login": "olivia", "password": PASSWORD})
        assert response.status_code == 302


def test_a_success_clears_the_failures_before_the_limit(settings):
    console_user("olivia")
    client = Client(REMOTE_ADDR="203.0.113.7")
    _fail(client, "olivia", 4)
    assert client.post("/login/", {"login": "olivia", "password": PASSWORD}).status_code == 302
    client.post("/logout/")
    _fail(client, "olivia", 4)
    assert client.post("/login/", {"login": "olivia", "password": PASSWORD}).status_code == 302


def test_the_admin_sign_in_is_throttled_too(settings):
    console_user("olivia").__class__.objects.filter(username="olivia").update(is_staff=True)
    client = Client(REMOTE_ADDR="203.0.113.7")
    for _ in range(5):
        client.post("/admin/login/", {"username": "olivia", "password": "wrong"})
    response = client.post("/admin/login/", {"username": "olivia", "password": PASSWORD})
    assert response.status_code == 429


def test_sign_out_is_a_post_and_ends_the_session(client):
    client.force_login(console_user("olivia"))
    assert client.get("/logout/").status_code == 405
    response = client.post("/logout/")
    assert response.status_code == 302
    assert response["Location"] == "/login/"
    assert client.get("/").status_code == 302


def test_sign_out_without_a_csrf_token_is_refused():
    client = Client(enforce_csrf_checks=True)
    client.force_login(console_user("olivia"))
    assert client.post("/logout/").status_code == 403
    assert client.get("/").status_code == 200


def test_an_administrator_can_lift_a_lockout_early():
    from django.core.management import call_command

    console_user("olivia")
    client = Client(REMOTE_ADDR="203.0.113.7")
    _fail(client, "olivia", 4)
    client.post("/login/", {"login": "olivia", "password": "wrong"})
    assert client.post("/login/", {"login": "olivia", "password": PASSWORD}).status_code == 429
    call_command("axes_reset_username", "olivia")
    assert client.post("/login/", {"login": "olivia", "password": PASSWORD}).status_code == 302


def _sign_in(client: Client, username: str, password: str, forwarded: str) -> int:
    data = {"login": username, "password": password}
    return client.post("/login/", data, HTTP_X_FORWARDED_FOR=forwarded).status_code


def test_a_forged_forwarded_for_is_ignored_without_the_proxy(settings):
    settings.SETTLE_BEHIND_PROXY = False
    console_user("olivia")
    client = Client(REMOTE_ADDR="203.0.113.7")
    # A client that writes a new X-Forwarded-For each time is still one address.
    for n in range(5):
        _sign_in(client, "olivia", "wrong", f"192.0.2.{n}")
    assert _sign_in(client, "olivia", PASSWORD, "198.51.100.9") == 429


def test_behind_the_proxy_the_client_is_counted_from_the_right(settings):
    settings.SETTLE_BEHIND_PROXY = True
    settings.SETTLE_PROXY_COUNT = 2
    console_user("sam")
    # Two proxies: the outer one appends the client, the inner one the outer's address.
    proxy = Client(REMOTE_ADDR="10.0.0.3")
    for n in range(5):
        # Whatever the attacker writes on the left does not change who it is.
        assert _sign_in(proxy, "sam", "wrong", f"192.0.2.{n}, 203.0.113.7, 10.0.0.2") in {200, 429}
    assert _sign_in(proxy, "sam", PASSWORD, "198.51.100.9, 203.0.113.7, 10.0.0.2") == 429
    # The owner, from another address through the same proxies, gets in.
    assert _sign_in(proxy, "sam", PASSWORD, "203.0.113.7, 198.51.100.9, 10.0.0.2") == 302
    # What axes records of each sign-in names the same client.
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {"203.0.113.7"}
    assert set(AccessLog.objects.values_list("ip_address", flat=True)) == {"198.51.100.9"}


def test_one_address_trying_many_usernames_is_locked_out_for_all_of_them(settings):
    settings.SETTLE_BEHIND_PROXY = True
    settings.SETTLE_LOGIN_ADDRESS_FAILURE_LIMIT = 20
    console_user("olivia")
    console_user("mallory")
    proxy = Client(REMOTE_ADDR="10.0.0.2")
    for n in range(19):
        assert _sign_in(proxy, f"user-{n}", "wrong", "203.0.113.7") == 200
    # Signing in to an account of its own does not wipe the address's other failures.
    assert _sign_in(proxy, "mallory", PASSWORD, "203.0.113.7") == 302
    proxy.post("/logout/")
    assert _sign_in(proxy, "user-19", "wrong", "203.0.113.7") == 429
    assert _sign_in(proxy, "olivia", PASSWORD, "203.0.113.7") == 429
    # The owner, from their own address, gets in.
    assert _sign_in(proxy, "olivia", PASSWORD, "198.51.100.9") == 302


@pytest.mark.parametrize(
    ("behind", "count", "forwarded", "address"),
    [
        (False, 1, "198.51.100.9", "10.0.0.2"),  # the header is the client's own word
        (True, 1, None, "10.0.0.2"),  # not through the proxy: only the peer is known
        (True, 1, "198.51.100.9", "198.51.100.9"),
        (True, 1, "8.8.8.8, 10.1.2.3", "10.1.2.3"),  # a private client is still the client
        (True, 2, "8.8.8.8, 198.51.100.9, 10.0.0.3", "198.51.100.9"),
        (True, 2, "198.51.100.9", "10.0.0.2"),  # fewer entries than proxies
    ],
)
def test_the_client_address_is_counted_from_the_right_only_behind_the_proxy(
    rf, settings, behind, count, forwarded, address
):
    from identity.throttle import client_address

    settings.SETTLE_BEHIND_PROXY, settings.SETTLE_PROXY_COUNT = behind, count
    headers = {} if forwarded is None else {"HTTP_X_FORWARDED_FOR": forwarded}
    assert client_address(rf.get("/login/", REMOTE_ADDR="10.0.0.2", **headers)) == address
