"""Webhook endpoints: their URLs and addresses checked, unknown events refused, secrets
rotated, and the ``webhook`` command."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from common.actors import COMMAND_LINE
from recovery.services.errors import Invalid
from webhooks.delivery import webhooks_deliver
from webhooks.endpoints import webhook_endpoint_add, webhook_endpoint_rotate, webhook_url_addresses
from webhooks.models import WebhookEndpoint

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/hook",
        "file:///etc/passwd",
        "http:///no-host",
        "http://user:pw@example.com/hook",
    ],
)
def test_a_url_that_is_not_http_with_a_host_is_refused(url):
    with pytest.raises(Invalid) as refused:
        webhook_url_addresses(url)
    assert refused.value.code == "invalid_webhook_url"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/hook",
        "http://localhost/hook",
        "http://[::1]/hook",
        "http://10.1.2.3/hook",
        "http://192.168.0.10/hook",
        "http://172.16.5.4/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://0.0.0.0/hook",
        "http://[::ffff:127.0.0.1]/hook",
    ],
)
def test_an_address_on_this_machine_or_a_private_network_is_refused(url, host):
    with pytest.raises(Invalid) as refused:
        webhook_endpoint_add(host_name=host.name, url=url, actor=COMMAND_LINE)
    assert refused.value.code == "private_webhook_url"
    assert "SETTLE_WEBHOOKS_ALLOW_PRIVATE" in refused.value.message
    assert not WebhookEndpoint.objects.exists()


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::a00:1",  # NAT64's well-known prefix around 10.0.0.1
        "64:ff9b::7f00:1",  # … around 127.0.0.1
        "64:ff9b:1::a00:1",  # the local-use NAT64 prefix, a network's own
        "64:ff9b:1:ffff::808:808",
        "::a00:1",  # IPv4-compatible ::10.0.0.1
        "::7f00:1",  # ::127.0.0.1
        "::ffff:a00:1",  # IPv4-mapped ::ffff:10.0.0.1
        "::ffff:a9fe:a9fe",  # ::ffff:169.254.169.254
        "fec0::1",  # site-local
        "feff:ffff::1",
        "2002:a00:1::1",  # 6to4 around 10.0.0.1
        "2002:7f00:1::",  # 6to4 around 127.0.0.1
        "2002:a9fe:a9fe::1",  # 6to4 around 169.254.169.254
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
    ],
)
def test_an_ipv6_address_around_a_private_one_or_in_a_private_range_is_refused(address):
    with pytest.raises(Invalid) as refused:
        webhook_url_addresses(f"http://[{address}]/hook")
    assert refused.value.code == "private_webhook_url"


@pytest.mark.parametrize(
    "address",
    [
        "8.8.8.8",
        "[2606:4700:4700::1111]",
        "[2a00:1450:4001:82b::200e]",
        "[64:ff9b::808:808]",  # NAT64 around 8.8.8.8: a public address, reached from IPv6
        "[2002:808:808::1]",  # 6to4 around 8.8.8.8
        "[::ffff:808:808]",
    ],
)
def test_a_public_address_passes_the_check(address):
    _, addresses = webhook_url_addresses(f"http://{address}/hook")
    assert addresses


def test_unknown_events_are_refused(host, receiver, allow_private):
    with pytest.raises(Invalid) as refused:
        webhook_endpoint_add(
            host_name=host.name, url=receiver.url, events=["op.exploded"], actor=COMMAND_LINE
        )
    assert refused.value.code == "invalid_webhook_events"


def test_after_a_rotation_both_secrets_verify_until_the_grace_ends(flow, endpoint, receiver):
    old = receiver.secrets[0]
    new = webhook_endpoint_rotate(
        endpoint_id=endpoint.pk, actor=COMMAND_LINE, grace=timedelta(hours=1)
    )
    receiver.secrets.append(new)
    assert new.startswith("whsec_") and new != old
    flow.approved()
    webhooks_deliver(seconds=2)
    assert receiver.received[-1].verified == {old: True, new: True}

    with time_machine.travel(timezone.now() + timedelta(hours=1, seconds=5)):
        flow.approved("op-2")
        webhooks_deliver(seconds=2)
    assert receiver.received[-1].verified == {old: False, new: True}


def test_the_webhook_command_adds_lists_rotates_and_disables(host, receiver, allow_private):
    from io import StringIO

    from django.core.management import CommandError, call_command

    out = StringIO()
    call_command(
        "webhook", "add", host.name, receiver.url, "--events", "operation.failed", stdout=out
    )
    secret = out.getvalue().split("shown once): ")[1].strip()
    assert secret.startswith("whsec_")
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.events == ",operation.failed,"

    out = StringIO()
    call_command("webhook", "list", stdout=out)
    assert receiver.url in out.getvalue() and "operation.failed" in out.getvalue()
    assert secret not in out.getvalue()  # write-only

    out = StringIO()
    call_command("webhook", "rotate", str(endpoint.pk), stdout=out)
    endpoint.refresh_from_db()
    assert endpoint.previous_secret == secret and endpoint.secret in out.getvalue()

    call_command("webhook", "disable", str(endpoint.pk), stdout=StringIO())
    endpoint.refresh_from_db()
    assert endpoint.status == "disabled"

    with pytest.raises(CommandError, match="invalid_webhook_url"):
        call_command("webhook", "add", host.name, "gopher://x", stdout=StringIO())
