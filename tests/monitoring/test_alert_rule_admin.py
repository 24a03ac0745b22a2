"""Alert rules in the Django admin: their URLs write-only, every change through the services
and on the audit log."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from audit.models import AuditEvent
from common.actors import Actor
from monitoring.models import AlertRule

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client):
    # force_login: django-axes needs the request that only a real sign-in carries.
    client.force_login(
        User.objects.create_superuser("root", "root@example.com", "pw-for-tests-only")
    )
    return client


def _rule_form(**fields):
    return {
        "name": "reconcile at night",
        "provider": "",
        "kind": "reconcile_entered",
        "threshold": "1",
        "new_urls": "",
        "window_minutes": "60",
        "enabled": "on",
        **fields,
    }


def test_alert_rule_urls_are_write_only_in_the_admin(admin_client):
    secret_url = "json://127.0.0.1:9/hooks?token=very-secret-0123"
    response = admin_client.post(
        "/admin/monitoring/alertrule/add/", _rule_form(new_urls=secret_url)
    )
    assert response.status_code == 302, response.content
    rule = AlertRule.objects.get()
    assert rule.url_list == [secret_url]
    change = f"/admin/monitoring/alertrule/{rule.pk}/change/"
    assert b"very-secret" not in admin_client.get(change).content
    # A blank field keeps the URLs; a new value replaces them.
    assert admin_client.post(change, _rule_form(threshold="2")).status_code == 302
    rule.refresh_from_db()
    assert rule.threshold == 2 and rule.url_list == [secret_url]
    replacement = "slack://T000/B000/XXXX\nmailto://ops:pw@example.com"
    assert admin_client.post(change, _rule_form(new_urls=replacement)).status_code == 302
    rule.refresh_from_db()
    assert rule.url_list == ["slack://T000/B000/XXXX", "mailto://ops:pw@example.com"]


def test_an_alert_rule_needs_urls_apprise_understands(admin_client):
    response = admin_client.post("/admin/monitoring/alertrule/add/", _rule_form())
    assert response.status_code == 200
    assert b"At least one Apprise URL is needed." in response.content
    secret_bad = "nonsense://secret-token-4567"
    response = admin_client.post(
        "/admin/monitoring/alertrule/add/", _rule_form(new_urls=f"json://127.0.0.1/\n{secret_bad}")
    )
    assert response.status_code == 200
    assert b"Apprise cannot send to URL 2." in response.content
    assert b"secret-token-4567" not in response.content
    assert not AlertRule.objects.exists()


def test_alert_rule_changes_are_audited_without_their_urls(admin_client):
    secret_url = "json://127.0.0.1:9/hooks?token=audit-secret-8910"
    assert (
        admin_client.post(
            "/admin/monitoring/alertrule/add/", _rule_form(new_urls=secret_url)
        ).status_code
        == 302
    )
    rule = AlertRule.objects.get()
    change = f"/admin/monitoring/alertrule/{rule.pk}/change/"
    form = _rule_form(threshold="5")
    del form["enabled"]  # unticked: the alert is silenced
    assert admin_client.post(change, form).status_code == 302
    assert (
        admin_client.post(
            f"/admin/monitoring/alertrule/{rule.pk}/delete/", {"post": "yes"}
        ).status_code
        == 302
    )
    assert not AlertRule.objects.exists()

    events = list(AuditEvent.objects.filter(kind="alert_rule_configured").order_by("id"))
    assert [event.data["change"] for event in events] == ["added", "changed", "deleted"]
    root = User.objects.get(username="root")
    assert all(event.actor == Actor("user", str(root.pk)) for event in events)
    added, changed, deleted = (event.data for event in events)
    assert added["changes"]["kind"] == [None, "reconcile_entered"] and added["urls_replaced"]
    assert changed["changes"] == {"threshold": [1, 5], "enabled": [True, False]}
    assert changed["urls_replaced"] is False
    assert deleted["rule_was"]["threshold"] == 5 and deleted["rule"] == "reconcile at night"
    assert not any("audit-secret" in str(event.data) for event in events)
