"""The audit trail: the events a user may read, filtered, paged, exported and verifiable.

The exports are checked the way their reader would check them: each event's hash is
recomputed offline from the exported fields alone (RFC 8785 + SHA-256, no Settle code),
and a complete chain is checked link by link from the genesis hash.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest
import rfc8785
import time_machine
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from audit.chain import audit_append, audit_transaction
from audit.hashing import exported_event_hash
from audit.kinds import AuditKind
from audit.models import AuditEvent, AuditVerification
from common.actors import Actor
from tests.support.audit import GENESIS, offline_hash
from tests.support.console import console_user

pytestmark = pytest.mark.django_db


def _events(response) -> list[int]:
    """The ids of the events listed, in order."""
    return [int(n) for n in re.findall(r'<tr data-event="(\d+)">', response.content.decode())]


def _keys(response) -> set[str]:
    return set(
        re.findall(
            r'<a class="key" href="/operations/[^"]+/">([^<]+)</a>', response.content.decode()
        )
    )


def _sealed(response) -> str:
    """The export's lines before its trailer, which must vouch for every byte of them."""
    body = b"".join(response.streaming_content).decode("utf-8")
    lines, _, trailer = body[:-1].rpartition("\n")
    lines += "\n" if lines else ""
    assert trailer.startswith("#settle-audit-export complete rows=")
    assert trailer.endswith(" sha256=" + hashlib.sha256(lines.encode("utf-8")).hexdigest())
    return lines


def _csv(response) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(_sealed(response))))


def _jsonl(response) -> list[dict[str, Any]]:
    return [json.loads(line) for line in _sealed(response).splitlines()]


@pytest.fixture
def supervisor(provider) -> User:
    return console_user("sofia", "supervisor", provider)


@pytest.fixture
def trail(stuck, other_stuck):
    """One operation of each provider, each with a chain of several events."""
    stuck.unknown("pay-1")
    other_stuck.unknown("ledger-1")


# -- who sees what --------------------------------------------------------------------


def test_an_operator_sees_the_events_of_their_providers_operations_only(signed_in, operator, trail):
    page = signed_in(operator).get("/audit/")
    assert page.status_code == 200
    expected = list(
        AuditEvent.objects.filter(operation_key="pay-1")
        .order_by("-id")
        .values_list("id", flat=True)
    )
    assert _events(page) == expected  # newest first, every one of them
    assert _keys(page) == {"pay-1"}
    html = page.content.decode()
    assert "ledger-1" not in html
    assert "<code>provider_configured</code>" not in html
    assert "<code>permission_granted</code>" not in html


def test_a_viewer_sees_them_too(signed_in, viewer, trail):
    page = signed_in(viewer).get("/audit/")
    assert _keys(page) == {"pay-1"}
    assert len(_events(page)) == AuditEvent.objects.filter(operation_key="pay-1").count()


def test_an_outsider_sees_nothing_of_another_providers_operations(signed_in, outsider, trail):
    client = signed_in(outsider)
    assert _keys(client.get("/audit/")) == {"ledger-1"}
    assert _events(client.get("/audit/?key=pay-1")) == []
    rows = _csv(client.get("/audit/export.csv"))
    assert rows and {row["chain"] for row in rows} == {"ledger-1"}
    assert _jsonl(client.get("/audit/export.jsonl?key=pay-1")) == []
    # Naming the other provider is not a way in: the export is refused, the page ignores it.
    assert client.get("/audit/export.csv?provider=orders").status_code == 400
    assert _keys(client.get("/audit/?provider=orders")) == {"ledger-1"}


def test_system_and_credential_events_are_for_supervisors_only(
    signed_in, operator, supervisor, trail
):
    system = set(AuditEvent.objects.filter(operation_key="").values_list("kind", flat=True))
    assert {"provider_configured", "permission_granted"} <= system
    html = signed_in(supervisor).get("/audit/?kind=provider_configured").content.decode()
    assert html.count("<tr data-event=") == 2  # orders and ledger
    assert '<span class="muted">system</span>' in html
    assert _events(signed_in(operator).get("/audit/?kind=provider_configured")) == []
    operator_rows = _csv(signed_in(operator).get("/audit/export.csv"))
    assert "" not in {row["chain"] for row in operator_rows}


def test_a_superuser_reads_every_chain(signed_in, trail):
    admin = User.objects.create_superuser("root", password="x")
    page = signed_in(admin).get("/audit/?provider=ledger")
    assert _keys(page) == {"ledger-1"}
    assert len(_events(signed_in(admin).get("/audit/"))) == min(50, AuditEvent.objects.count())


def test_anonymous_users_are_sent_to_sign_in(client, trail):
    for path in ("/audit/", "/audit/export.csv", "/audit/export.jsonl"):
        response = client.get(path)
        assert response.status_code == 302
        assert response["Location"].startswith("/login/?next=")
    assert not AuditEvent.objects.filter(kind="audit_exported").exists()


def test_the_trail_and_its_exports_refuse_post(signed_in, operator, trail):
    client = signed_in(operator)
    for path in ("/audit/", "/audit/export.csv", "/audit/export.jsonl"):
        assert client.post(path).status_code == 405
    assert not AuditEvent.objects.filter(kind="audit_exported").exists()


# -- filters and pages ----------------------------------------------------------------


def test_filter_by_operation_key(signed_in, supervisor, stuck):
    stuck.unknown("pay-1")
    stuck.unknown("pay-2")
    page = signed_in(supervisor).get("/audit/?key=pay-2")
    assert _keys(page) == {"pay-2"}
    assert len(_events(page)) == AuditEvent.objects.filter(operation_key="pay-2").count()


def test_filter_by_kind(signed_in, operator, trail):
    page = signed_in(operator).get("/audit/?kind=registered")
    assert _events(page) == list(
        AuditEvent.objects.filter(operation_key="pay-1", kind="registered").values_list(
            "id", flat=True
        )
    )


def test_filter_by_provider(signed_in, trail):
    admin = User.objects.create_superuser("root", password="x")
    page = signed_in(admin).get("/audit/?provider=orders")
    assert _keys(page) == {"pay-1"}
    # A provider's trail is its operations' chains: the system chain is nobody's.
    assert '<span class="muted">system</span>' not in page.content.decode()


def test_filter_by_actor_name_or_kind_and_name(signed_in, supervisor, trail):
    client = signed_in(supervisor)
    # The host serves both providers; this supervisor reads the orders operations only.
    by_host = AuditEvent.objects.filter(
        actor__startswith="host:", actor__endswith=":fleet-a"
    ).exclude(operation_key="ledger-1")
    expected = sorted(by_host.values_list("id", flat=True), reverse=True)
    assert expected
    assert _events(client.get("/audit/?actor=host:fleet-a")) == expected
    assert _events(client.get("/audit/?actor=fleet-a")) == expected
    assert _events(client.get("/audit/?actor=approver:fleet-a")) == []
    assert _events(client.get("/audit/?actor=fleet")) == []  # a whole name, not a part


def test_filter_by_date_range_in_whole_utc_days(signed_in, supervisor, provider):
    then = datetime(2026, 1, 10, 23, 59, tzinfo=UTC)
    with time_machine.travel(then, tick=False), audit_transaction():
        old = audit_append(kind="test_old", actor=Actor.system("test"))
    client = signed_in(supervisor)
    assert _events(client.get("/audit/?since=2026-01-10&until=2026-01-10")) == [old.pk]
    assert _events(client.get("/audit/?until=2026-01-09")) == []
    assert old.pk not in _events(client.get("/audit/?since=2026-01-11"))


def _next_query(response) -> str | None:
    found = re.findall(r'<a href="\?([^"]+)" hx-get', response.content.decode())
    return found[0].replace("&amp;", "&") if found else None


def test_pages_continue_from_the_last_event_without_overlap(
    signed_in, supervisor, trail, monkeypatch
):
    monkeypatch.setattr("console.views.audit.PAGE_SIZE", 4)
    client = signed_in(supervisor)
    # The supervisor's trail interleaves the system chain and the orders operation's.
    visible = AuditEvent.objects.exclude(operation_key="ledger-1").order_by("-id")
    expected = list(visible.values_list("id", flat=True))
    assert {"", "pay-1"} == set(visible.values_list("operation_key", flat=True))
    pages = [client.get("/audit/")]
    while (query := _next_query(pages[-1])) is not None:
        pages.append(client.get("/audit/?" + query))
    assert [_events(page) for page in pages] == [
        expected[n : n + 4] for n in range(0, len(expected), 4)
    ]
    # htmx asks for the results only.
    query = _next_query(pages[0])
    partial = client.get("/audit/?" + query, HTTP_HX_REQUEST="true")
    assert _events(partial) == expected[4:8]
    assert "<html" not in partial.content.decode()


def test_a_page_never_counts_and_never_skips_rows(signed_in, supervisor, trail, monkeypatch):
    monkeypatch.setattr("console.views.audit.PAGE_SIZE", 4)
    client = signed_in(supervisor)
    query = _next_query(client.get("/audit/"))
    with CaptureQueriesContext(connection) as queries:
        assert client.get("/audit/?" + query).status_code == 200
    events = [q["sql"] for q in queries.captured_queries if "audit_auditevent" in q["sql"]]
    assert events  # one per branch: the operations' chains, the system chain
    for sql in events:
        assert "COUNT(" not in sql.upper() and "OFFSET" not in sql.upper()
        assert '"audit_auditevent"."id" < ' in sql and "LIMIT 5" in sql


def test_an_actor_filter_is_text_not_a_pattern(signed_in, supervisor, trail):
    client = signed_in(supervisor)
    for actor in ("host:.*", "(.*)", "fleet-.", "host:[a-z]+", "%", "_"):
        page = client.get("/audit/", {"actor": actor})
        assert page.status_code == 200
        assert _events(page) == [], actor


@pytest.mark.parametrize(
    "query, field",
    [
        ("since=not-a-date", "since"),
        ("until=2026-02-31", "until"),
        ("until=9999-12-31", "until"),
        ("since=2026-03-02&until=2026-03-01", "until"),
        ("actor=" + "x" * 5000, "actor"),
        ("key=" + "k" * 201, "key"),
        ("kind=a%00b", "kind"),
        ("after=abc", "after"),
        ("after=-5", "after"),
    ],
)
def test_a_bad_filter_is_shown_and_ignored_never_a_500(signed_in, operator, trail, query, field):
    client = signed_in(operator)
    page = client.get(f"/audit/?{query}")
    assert page.status_code == 200
    assert f"Ignored: {field} (" in page.content.decode()
    assert _keys(page) == {"pay-1"}
    refused = client.get(f"/audit/export.csv?{query}")
    assert refused.status_code == 400
    assert refused.content.decode().startswith("invalid_filter: ")
    assert not AuditEvent.objects.filter(kind="audit_exported").exists()


# -- exports --------------------------------------------------------------------------


def _assert_verifiable(rows: list[dict[str, Any]]) -> None:
    """Each event's hash from its exported fields; a complete chain, link by link."""
    for row in rows:
        assert offline_hash(row) == row["hash"], row
        assert exported_event_hash(row) == row["hash"]  # Settle's function agrees
    by_chain: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_chain.setdefault(row["chain"], []).append(row)
    for chain_rows in by_chain.values():
        assert [int(r["seq"]) for r in chain_rows] == list(range(1, len(chain_rows) + 1))
        previous = GENESIS
        for row in chain_rows:
            assert row["prev_hash"] == previous
            previous = row["hash"]


def test_the_csv_export_carries_every_hashed_field_and_verifies_offline(signed_in, operator, trail):
    response = signed_in(operator).get("/audit/export.csv?key=pay-1")
    assert response.status_code == 200
    assert response.streaming
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert re.fullmatch(
        r'attachment; filename="settle-audit-\d{8}T\d{6}Z\.csv"', response["Content-Disposition"]
    )
    rows = _csv(response)
    stored = list(AuditEvent.objects.filter(operation_key="pay-1").order_by("id"))
    assert [int(row["id"]) for row in rows] == [event.pk for event in stored]
    assert list(rows[0]) == [
        "id",
        "at",
        "chain",
        "seq",
        "kind",
        "actor",
        "data",
        "prev_hash",
        "hash",
    ]
    assert rows[0]["kind"] == "registered" and rows[0]["chain"] == "pay-1"
    assert rows[0]["data"] == rfc8785.dumps(stored[0].data).decode()  # canonical JSON
    _assert_verifiable(rows)


def test_the_jsonl_export_verifies_offline_and_an_edited_line_does_not(signed_in, trail):
    admin = User.objects.create_superuser("root", password="x")
    response = signed_in(admin).get("/audit/export.jsonl")
    assert response["Content-Type"] == "application/jsonl; charset=utf-8"
    rows = _jsonl(response)
    # Everything a superuser may read: both operations' chains and the system chain
    # (its newest event, this very export, is in it).
    assert {row["chain"] for row in rows} == {"", "pay-1", "ledger-1"}
    assert rows[-1]["kind"] == "audit_exported"
    assert len(rows) == AuditEvent.objects.count()
    _assert_verifiable(rows)
    forged = {**rows[1], "actor": "user:1:mallory"}
    assert offline_hash(forged) != forged["hash"]


def test_each_export_is_audited_with_who_what_and_which_format(signed_in, operator, trail):
    client = signed_in(operator)
    client.get("/audit/export.csv?key=pay-1&kind=transition")
    client.get("/audit/export.jsonl")
    exported = list(AuditEvent.objects.filter(kind="audit_exported").order_by("id"))
    assert [e.operation_key for e in exported] == ["", ""]  # the system chain
    assert [e.actor for e in exported] == [Actor.of("user", operator)] * 2
    assert exported[0].data == {"format": "csv", "filters": {"key": "pay-1", "kind": "transition"}}
    assert exported[1].data == {"format": "jsonl", "filters": {}}


def test_an_export_streams_from_a_server_side_cursor(signed_in, supervisor, trail):
    if connection.vendor != "postgresql":
        pytest.skip("server-side cursors are PostgreSQL's")
    response = signed_in(supervisor).get("/audit/export.jsonl")
    lines = iter(response.streaming_content)
    next(lines)  # the first event is out; the rest wait in the cursor
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_cursors")
        # One cursor per branch: the operations' chains and the system chain.
        assert cursor.fetchone()[0] == 2
    rest = list(lines)
    # The other events, then the trailer.
    assert len(rest) == AuditEvent.objects.exclude(operation_key="ledger-1").count()


# -- the log's verification -----------------------------------------------------------


def _tamper(sql: str, params: list[Any]) -> None:
    """As a table owner would (tests/audit/test_audit_chain.py): triggers off, then on.

    The append-only triggers are PostgreSQL's; on SQLite the edit needs nothing switched off.
    """
    postgresql = connection.vendor == "postgresql"
    with connection.cursor() as cursor:
        if postgresql:
            cursor.execute("ALTER TABLE audit_auditevent DISABLE TRIGGER USER")
        cursor.execute(sql, params)
        if postgresql:
            cursor.execute("ALTER TABLE audit_auditevent ENABLE TRIGGER USER")


def test_the_page_says_when_nothing_was_verified_yet(signed_in, operator, trail):
    html = signed_in(operator).get("/audit/").content.decode()
    assert "not verified yet" in html and "No checkpoint signed yet" in html


@pytest.mark.django_db(transaction=True)
def test_the_page_shows_the_last_verification_and_checkpoint_then_the_first_problem(
    signed_in, operator, supervisor, trail
):
    call_command("verify_audit")
    verified = AuditVerification.objects.get()
    assert verified.ok and verified.events_checked == AuditEvent.objects.count()
    html = signed_in(operator).get("/audit/").content.decode()
    health = html[html.index("data-audit-health") : html.index("</section>")]
    assert "verified intact" in health
    assert f"{verified.events_checked} events checked" in health
    assert "Last checkpoint #1 signed" in health
    assert re.search(r'<time datetime="[^"]+Z" title="[^"]+ UTC">just now</time>', health)

    _tamper(
        "UPDATE audit_auditevent SET actor = 'forged' WHERE operation_key = %s AND seq = %s",
        ["pay-1", 2],
    )
    with pytest.raises(CommandError, match="content does not match"):
        call_command("verify_audit")
    latest = AuditVerification.objects.order_by("-id").first()
    assert (
        not latest.ok
        and latest.problem == "chain 'pay-1', event #2: content does not match its hash (edited)"
    )
    html = signed_in(supervisor).get("/audit/").content.decode()
    assert "problem found" in html
    assert "chain &#x27;pay-1&#x27;, event #2: content does not match its hash (edited)" in html
    # Where it broke names an operation: an operator learns that, not where.
    html = signed_in(operator).get("/audit/").content.decode()
    assert "problem found" in html and "event #2" not in html


def test_the_kind_filter_offers_every_kind_the_services_write(signed_in, supervisor):
    html = signed_in(supervisor).get("/audit/").content.decode()
    datalist = re.search(r'<datalist id="audit-kinds">(.*?)</datalist>', html).group(1)
    offered = re.findall(r'<option value="([^"]+)">', datalist)
    assert offered == list(AuditKind.values)
