"""The console's webhook pages: endpoints, deliveries, and who may redeliver one."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from audit.models import AuditEvent
from common.actors import COMMAND_LINE
from tests.support.console import console_user
from webhooks.endpoints import webhook_endpoint_add
from webhooks.models import WebhookEndpoint, WebhookMessage

pytestmark = pytest.mark.django_db


@pytest.fixture
def endpoint(host, settings) -> WebhookEndpoint:
    settings.SETTLE_WEBHOOKS_ALLOW_PRIVATE = True
    added, _ = webhook_endpoint_add(
        host_name=host.name, url="http://127.0.0.1:9/hooks", actor=COMMAND_LINE
    )
    return added


@pytest.fixture
def delivered(flow, endpoint) -> WebhookMessage:
    flow.approved()
    message = WebhookMessage.objects.get()
    WebhookMessage.objects.filter(pk=message.pk).update(
        status="failed", attempts=7, last_status_code=500, last_attempt_at=timezone.now()
    )
    return message


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)  # django-axes needs the request only a real sign-in carries
    return client


def redeliver_url(message: WebhookMessage) -> str:
    return f"/webhooks/{message.endpoint_id}/deliveries/{message.pk}/redeliver"


def test_the_endpoint_page_shows_each_delivery_with_its_attempts_and_answer(delivered, operator):
    client = signed_in(operator)
    listing = client.get("/webhooks/")
    assert listing.status_code == 200 and "http://127.0.0.1:9/…" in listing.content.decode()
    page = client.get(f"/webhooks/{delivered.endpoint_id}/")
    assert page.status_code == 200
    text = page.content.decode()
    assert delivered.msg_id in text and "approval.decided" in text
    assert "HTTP 500" in text and ">7<" in text and "Redeliver" in text
    assert "whsec_" not in text


def test_an_operator_of_the_provider_redelivers_a_delivery(delivered, operator):
    response = signed_in(operator).post(redeliver_url(delivered))
    assert response.status_code == 302
    delivered.refresh_from_db()
    assert delivered.status == "pending" and delivered.next_attempt_at <= timezone.now()
    assert delivered.attempts == 7  # kept; the same webhook-id goes out again
    event = AuditEvent.objects.get(kind="webhook_redelivered")
    assert event.data["msg_id"] == delivered.msg_id


def test_a_viewer_may_see_but_not_redeliver(delivered, viewer):
    client = signed_in(viewer)
    page = client.get(f"/webhooks/{delivered.endpoint_id}/")
    assert page.status_code == 200 and b"Redeliver" not in page.content
    assert client.post(redeliver_url(delivered)).status_code == 403
    delivered.refresh_from_db()
    assert delivered.status == "failed"


def test_an_operator_of_another_provider_is_told_it_does_not_exist(delivered, other_provider):
    outsider = console_user("oscar", "operator", other_provider)
    client = signed_in(outsider)
    page = client.get(f"/webhooks/{delivered.endpoint_id}/")
    assert page.status_code == 200 and delivered.msg_id.encode() not in page.content
    assert client.post(redeliver_url(delivered)).status_code == 404
    delivered.refresh_from_db()
    assert delivered.status == "failed"


def test_a_user_without_any_role_sees_no_endpoint(delivered):
    nobody = console_user("nina")
    client = signed_in(nobody)
    assert b"127.0.0.1:9" not in client.get("/webhooks/").content
    assert client.get(f"/webhooks/{delivered.endpoint_id}/").status_code == 404


def test_anonymous_is_sent_to_sign_in(delivered):
    response = Client().post(redeliver_url(delivered))
    assert response.status_code == 302 and "/login/" in response["Location"]
    delivered.refresh_from_db()
    assert delivered.status == "failed"


def test_a_redeliver_without_the_csrf_token_is_refused(delivered, operator):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    assert client.post(redeliver_url(delivered)).status_code == 403
    delivered.refresh_from_db()
    assert delivered.status == "failed"


SECRET_URL = "http://127.0.0.1:9/hooks/T0KEN-in-the-path?key=s3cret-in-the-query"


@pytest.fixture
def secret_endpoint(host, settings) -> WebhookEndpoint:
    settings.SETTLE_WEBHOOKS_ALLOW_PRIVATE = True
    added, _ = webhook_endpoint_add(host_name=host.name, url=SECRET_URL, actor=COMMAND_LINE)
    return added


def _pages(client: Client, endpoint: WebhookEndpoint) -> list[str]:
    pages = [client.get("/webhooks/"), client.get(f"/webhooks/{endpoint.pk}/")]
    assert [page.status_code for page in pages] == [200, 200]
    return [page.content.decode() for page in pages]


@pytest.mark.parametrize("role", ["viewer", "operator", "supervisor"])
def test_an_endpoint_url_shows_only_its_scheme_and_host_to_who_may_not_configure_it(
    secret_endpoint, role, request
):
    user = request.getfixturevalue(role)
    for text in _pages(signed_in(user), secret_endpoint):
        assert "T0KEN" not in text and "s3cret" not in text, role
        assert "http://127.0.0.1:9/…" in text


def test_an_endpoint_url_is_shown_in_full_to_who_may_configure_endpoints(secret_endpoint, viewer):
    from django.contrib.auth.models import Permission

    viewer.user_permissions.add(Permission.objects.get(codename="change_webhookendpoint"))
    for text in _pages(signed_in(viewer), secret_endpoint):
        assert "/hooks/T0KEN-in-the-path?key=s3cret-in-the-query" in text.replace("&amp;", "&")


def test_staff_who_may_only_view_endpoints_in_the_admin_never_see_the_full_url(
    secret_endpoint, django_user_model
):
    from django.contrib.auth.models import Permission

    staff = django_user_model.objects.create_user("vera", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_webhookendpoint"))
    client = signed_in(staff)
    for path in (
        "/admin/webhooks/webhookendpoint/",
        f"/admin/webhooks/webhookendpoint/{secret_endpoint.pk}/change/",
    ):
        page = client.get(path)
        assert page.status_code == 200, path
        text = page.content.decode()
        assert "T0KEN" not in text and "s3cret" not in text, path
        assert "http://127.0.0.1:9/…" in text, path


def test_a_superuser_sees_the_full_url_in_the_admin(secret_endpoint, django_user_model):
    root = django_user_model.objects.create_superuser("root", "root@example.com", "pw-for-tests")
    page = signed_in(root).get("/admin/webhooks/webhookendpoint/")
    assert "T0KEN-in-the-path" in page.content.decode()


def test_the_audit_trail_names_an_endpoint_without_its_token(secret_endpoint, supervisor):
    event = AuditEvent.objects.get(kind="webhook_configured")
    assert "T0KEN" not in str(event.data) and "s3cret" not in str(event.data)
    assert event.data["url"] == "http://127.0.0.1:9/…"
    page = signed_in(supervisor).get("/audit/")
    assert page.status_code == 200 and "webhook_configured" in page.content.decode()
    assert "T0KEN" not in page.content.decode()
