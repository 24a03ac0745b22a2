"""Credentials and providers are reachable in the Django admin, through the same services."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import get_messages

from approvals.models import Approver
from audit.models import AuditEvent
from common.actors import Actor
from common.credentials import token_hash
from recovery.models import Host, Provider

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client):
    # force_login: django-axes needs the request that only a real sign-in carries.
    client.force_login(
        User.objects.create_superuser("root", "root@example.com", "pw-for-tests-only")
    )
    return client


def _token_from_messages(response) -> str:
    (message,) = [
        m.message for m in get_messages(response.wsgi_request) if "shown once" in m.message
    ]
    return message.rsplit(": ", 1)[1]


def test_adding_a_host_in_the_admin_shows_its_token_once(admin_client):
    response = admin_client.post("/admin/recovery/host/add/", {"name": "fleet-z"})
    assert response.status_code == 302
    token = _token_from_messages(response)
    assert Host.objects.get(name="fleet-z").token_hash == token_hash(token)


def _cookies_carry(response, secret: str) -> bool:
    return any(secret in morsel.value for morsel in response.cookies.values())


def test_a_new_hosts_token_waits_in_the_session_not_in_a_cookie(admin_client):
    response = admin_client.post("/admin/recovery/host/add/", {"name": "fleet-z"})
    token = _token_from_messages(response)
    assert "messages" not in response.cookies and not _cookies_carry(response, token)
    shown = admin_client.get("/admin/recovery/host/")  # where the message shows, once
    assert token.encode() in shown.content and not _cookies_carry(shown, token)
    assert token.encode() not in admin_client.get("/admin/recovery/host/").content


def test_a_new_webhook_secret_waits_in_the_session_not_in_a_cookie(admin_client, settings):
    from recovery.services.credentials import host_create

    settings.SETTLE_WEBHOOKS_ALLOW_PRIVATE = True
    host, _ = host_create(name="fleet-w")
    response = admin_client.post(
        "/admin/webhooks/webhookendpoint/add/",
        {"host": host.pk, "url": "http://127.0.0.1:9/hook", "event_types": ["operation.failed"]},
    )
    secret = _token_from_messages(response)
    assert secret.startswith("whsec_")
    assert "messages" not in response.cookies and not _cookies_carry(response, secret)
    shown = admin_client.get("/admin/webhooks/webhookendpoint/")
    assert secret.encode() in shown.content and not _cookies_carry(shown, secret)
    assert secret.encode() not in admin_client.get("/admin/webhooks/webhookendpoint/").content


def test_adding_an_approver_in_the_admin_shows_its_token_once(admin_client):
    response = admin_client.post(
        "/admin/approvals/approver/add/",
        {"name": "desk", "providers": '["orders"]', "hosts": "[]"},
    )
    token = _token_from_messages(response)
    desk = Approver.objects.get(name="desk")
    assert desk.token_hash == token_hash(token)
    assert (desk.providers, desk.all_providers) == (["orders"], False)


def test_provider_saved_in_the_admin_is_configured_and_audited(admin_client, tmp_path):
    response = admin_client.post(
        "/admin/recovery/provider/add/",
        {
            "name": "ledger",
            "adapter": "journal",
            "path": str(tmp_path / "j.jsonl"),
            "url": "",
            "new_secret": "",
            "timeout_seconds": "3",
            "lease_seconds": "30",
            "lookup_budget": "4",
        },
    )
    assert response.status_code == 302
    provider = Provider.objects.get(name="ledger")
    assert (provider.lease_seconds, provider.lookup_budget) == (30, 4)
    event = AuditEvent.objects.get(kind="provider_configured")
    root = User.objects.get(username="root")
    assert (event.actor, event.actor.name) == (Actor("user", str(root.pk)), "root")


def test_evidence_and_audit_are_read_only_in_the_admin(admin_client):
    assert admin_client.get("/admin/audit/auditevent/").status_code == 200
    assert admin_client.get("/admin/audit/auditevent/add/").status_code == 403
    assert admin_client.get("/admin/recovery/evidence/add/").status_code == 403


# -- providers: one audited service, renames, a write-only secret -----------------------

SECRET = "the-provider-hmac-secret-0123456789"


@pytest.fixture
def http_provider(db) -> Provider:
    from recovery.services.providers import provider_configure

    provider, _ = provider_configure(
        name="payments", adapter="http", url="https://payments.example/api", secret=SECRET
    )
    return provider


def _form(provider: Provider, **changes: str) -> dict[str, str]:
    data = {
        "name": provider.name,
        "adapter": provider.adapter,
        "path": provider.path,
        "url": provider.url,
        "new_secret": "",
        "timeout_seconds": str(provider.timeout_seconds),
        "lease_seconds": str(provider.lease_seconds),
        "lookup_budget": str(provider.lookup_budget),
    }
    return {**data, **changes}


def _staff(client, username: str, *codenames: str):
    from django.contrib.auth.models import Permission

    user = User.objects.create_user(username, password="pw-for-tests-only", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client.force_login(user)
    return client


def test_staff_who_may_only_view_providers_never_see_the_secret(client, http_provider):
    viewer = _staff(client, "viewer", "view_provider")
    response = viewer.get(f"/admin/recovery/provider/{http_provider.pk}/change/")
    assert response.status_code == 200
    assert "payments.example" in response.content.decode()
    assert SECRET not in response.content.decode()
    assert (
        viewer.post(
            f"/admin/recovery/provider/{http_provider.pk}/change/", _form(http_provider)
        ).status_code
        == 403
    )


def test_the_change_form_never_shows_the_secret_back(client, http_provider):
    editor = _staff(client, "editor", "view_provider", "change_provider")
    page = editor.get(f"/admin/recovery/provider/{http_provider.pk}/change/").content.decode()
    assert 'name="new_secret"' in page
    assert SECRET not in page


def test_a_blank_secret_keeps_it_and_a_new_one_replaces_it_unseen_in_the_audit(
    admin_client, http_provider
):
    url = f"/admin/recovery/provider/{http_provider.pk}/change/"
    assert admin_client.post(url, _form(http_provider, lookup_budget="9")).status_code == 302
    http_provider.refresh_from_db()
    assert (http_provider.secret, http_provider.lookup_budget) == (SECRET, 9)
    assert (
        admin_client.post(url, _form(http_provider, new_secret="rotated-0123")).status_code == 302
    )
    http_provider.refresh_from_db()
    assert http_provider.secret == "rotated-0123"
    events = list(AuditEvent.objects.filter(kind="provider_configured").order_by("id"))
    assert events[-2].data["changes"] == {"lookup_budget": [5, 9]}
    assert (events[-2].data["secret_changed"], events[-1].data["secret_changed"]) == (False, True)
    assert all(SECRET not in str(e.data) and "rotated-0123" not in str(e.data) for e in events)


def test_renaming_a_provider_in_the_admin_keeps_one_provider_and_its_permits(
    admin_client, http_provider
):
    from approvals.models import Approval, Permit
    from approvals.services.approvals import Binding, approval_request, approval_resolve

    binding = Binding("op-9", "payment.send", "payments", "sha256:" + "a" * 64)
    approval, _ = approval_request(binding=binding, requested_by=Actor("host", "1", "a"))
    approval_resolve(
        approval_id=approval.pk,
        binding=binding,
        approve=True,
        decided_by=Actor("approver", "1", "x"),
        ttl_seconds=60,
    )
    url = f"/admin/recovery/provider/{http_provider.pk}/change/"
    assert admin_client.post(url, _form(http_provider, name="payments-eu")).status_code == 302
    assert list(Provider.objects.values_list("pk", "name")) == [(http_provider.pk, "payments-eu")]
    assert Approval.objects.get().provider == Permit.objects.get().provider == "payments-eu"
    event = AuditEvent.objects.filter(kind="provider_configured").last()
    assert event.data["changes"]["name"] == ["payments", "payments-eu"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"url": "ftp://payments.example/"}, "http:// or https://"),
        ({"adapter": "journal", "path": "relative.jsonl"}, "must be absolute"),
        ({"name": "no spaces please"}, "letters, digits"),
    ],
)
def test_invalid_provider_settings_are_refused_by_the_form(
    admin_client, http_provider, change, message
):
    url = f"/admin/recovery/provider/{http_provider.pk}/change/"
    response = admin_client.post(url, _form(http_provider, **change))
    assert response.status_code == 200
    assert message in response.content.decode()
    http_provider.refresh_from_db()
    assert http_provider.name == "payments"


def test_an_mcp_provider_is_added_in_the_admin_and_its_server_never_shown_back(admin_client):
    secret = '{"url": "https://tools.example/mcp/tok-123", "bearer": "b-9"}'
    data = {**_form(Provider(name="tools", adapter="mcp")), "new_secret": secret}
    assert admin_client.post("/admin/recovery/provider/add/", data).status_code == 302
    provider = Provider.objects.get(name="tools")
    assert (provider.adapter, provider.secret) == ("mcp", secret)
    page = admin_client.get(f"/admin/recovery/provider/{provider.pk}/change/").content.decode()
    assert "tok-123" not in page and "b-9" not in page


def test_an_mcp_provider_with_a_bad_server_description_is_refused_by_the_form(admin_client):
    data = {**_form(Provider(name="tools", adapter="mcp")), "new_secret": '{"url": "tools"}'}
    response = admin_client.post("/admin/recovery/provider/add/", data)
    assert response.status_code == 200
    assert "http:// or https://" in response.content.decode()
    assert not Provider.objects.exists()


def test_adding_a_webhook_endpoint_in_the_admin_shows_its_secret_once(admin_client, settings):
    from recovery.services.credentials import host_create
    from webhooks.models import WebhookEndpoint

    settings.SETTLE_WEBHOOKS_ALLOW_PRIVATE = True
    host, _ = host_create(name="fleet-w")
    response = admin_client.post(
        "/admin/webhooks/webhookendpoint/add/",
        {"host": host.pk, "url": "http://127.0.0.1:9/hook", "event_types": ["operation.failed"]},
    )
    assert response.status_code == 302, response.content
    secret = _token_from_messages(response)
    endpoint = WebhookEndpoint.objects.get()
    assert secret.startswith("whsec_") and endpoint.secret == secret
    assert endpoint.events == ",operation.failed,"
    shown = admin_client.get("/admin/webhooks/webhookendpoint/")  # where the message shows
    assert secret.encode() in shown.content
    page = admin_client.get(f"/admin/webhooks/webhookendpoint/{endpoint.pk}/change/")
    assert page.status_code == 200 and secret.encode() not in page.content
    assert AuditEvent.objects.filter(kind="webhook_configured").exists()


def test_a_private_webhook_url_is_refused_by_the_admin_form(admin_client):
    from recovery.services.credentials import host_create
    from webhooks.models import WebhookEndpoint

    host, _ = host_create(name="fleet-w")
    response = admin_client.post(
        "/admin/webhooks/webhookendpoint/add/", {"host": host.pk, "url": "http://10.0.0.5/hook"}
    )
    assert response.status_code == 200
    assert b"SETTLE_WEBHOOKS_ALLOW_PRIVATE" in response.content
    assert not WebhookEndpoint.objects.exists()
