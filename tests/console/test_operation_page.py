"""The operation page: its timeline, permit history, what differs, and the live region."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from approvals.models import Permit, PermitEvent
from audit.chain import audit_append, audit_transaction
from common.actors import Actor
from harness.providers import digest_of, sqlite_provider_commit
from recovery.models import LookupAttempt, Operation
from recovery.selectors.operation_page import PERMIT_LINES, TIMELINE_LIMIT, operation_timeline
from recovery.services.locking import operation_lock
from recovery.services.lookup_tasks import lookup_attempt_run
from tests.support.console import queue_lookup
from tests.support.flow import PARAMS

pytestmark = pytest.mark.django_db


def _page(client: Client, key: str, **headers: str) -> str:
    response = client.get(f"/operations/{key}/", **headers)
    assert response.status_code == 200
    return response.content.decode()


def _section(html: str, title_id: str) -> str:
    """The HTML of the card whose heading has ``title_id``."""
    start = html.index(f'id="{title_id}"')
    return html[start : html.index("</section>", start)]


def _append(operation: Operation, kind: str, count: int = 1, **data: object) -> None:
    with audit_transaction():
        locked = operation_lock(operation)
        for _ in range(count):
            audit_append(kind=kind, operation=locked, actor=Actor.system("test"), data=data)


def test_the_timeline_merges_the_chain_and_lookups_newest_first(client, operator, stuck):
    operation = stuck.mismatch("op-1")
    timeline = operation_timeline(operation=operation)
    times = [entry.at for entry in timeline.entries]
    assert times == sorted(times, reverse=True)
    kinds = [entry.kind for entry in timeline.entries]
    assert {"registered", "permit_consumed", "transition", "evidence", "lookup"} <= set(kinds)
    newest = timeline.entries[0]
    assert newest.kind == "transition"
    assert newest.summary == "unknown → reconcile (escalate): mismatch"
    assert not timeline.truncated

    client.force_login(operator)
    section = _section(_page(client, "op-1"), "timeline-title")
    escalated = section.index("unknown → reconcile (escalate): mismatch")
    lapsed = section.index("dispatched → unknown (lease lost)")
    registered = section.index("Registered")
    assert escalated < lapsed < registered  # newest first
    assert "Lookup (resume) finished: mismatch" in section
    assert re.search(r'<time datetime="[^"]+Z" title="[^"]+ UTC">', section)


def test_an_event_of_a_kind_the_page_does_not_know_still_shows(client, operator, stuck):
    operation = stuck.unknown("op-1")
    _append(operation, "claim_taken", claimed_by="olivia")
    client.force_login(operator)
    section = _section(_page(client, "op-1"), "timeline-title")
    assert "Claim taken" in section
    assert "&quot;claimed_by&quot;: &quot;olivia&quot;" in section  # its data, as it is


def test_the_timeline_shows_the_newest_entries_and_links_the_rest(client, operator, stuck):
    operation = stuck.unknown("op-1")
    _append(operation, "note", count=TIMELINE_LIMIT + 5, text="again")
    client.force_login(operator)
    section = _section(_page(client, "op-1"), "timeline-title")
    assert section.count('<li class="line kind-') == TIMELINE_LIMIT
    assert f"Only the newest {TIMELINE_LIMIT} entries are shown" in section
    assert 'href="/audit/?key=op-1"' in section
    assert "Registered" not in section  # the oldest were left out
    short = operation_timeline(operation=operation, limit=3)
    assert [entry.kind for entry in short.entries] == ["note"] * 3 and short.truncated


def test_the_permit_history_shows_every_refusal_with_its_reason(client, operator, flow):
    flow.approved("op-1", PARAMS)
    wrong = flow.dispatch("op-1", digest_of({**PARAMS, "amount": 1}), worker="w-1")
    assert wrong.json()["error"] == "action_mismatch"
    assert flow.dispatch("op-1", digest_of(PARAMS), worker="w-2").status_code == 200
    again = flow.dispatch("op-1", digest_of(PARAMS), worker="w-3")
    assert again.json()["error"] == "already_consumed"
    client.force_login(operator)
    section = _section(_page(client, "op-1"), "permits-title")
    lines = re.findall(r'<li class="line kind-(\w+)">', section)
    assert lines == ["issued", "refused", "consumed", "refused"]  # oldest first
    assert '<span class="reason">action_mismatch</span>' in section
    assert '<span class="reason">already_consumed</span>' in section
    assert "by host:fleet-a" in section and "by approver:alice-phone" in section


def test_a_mismatch_shows_which_parameters_differ(client, operator, stuck):
    stuck.mismatch("op-1")  # the provider's record says amount 9, not 1250
    client.force_login(operator)
    html = _page(client, "op-1")
    differences = _section(html, "differences-title")
    assert re.findall(r"<tr><th scope=\"row\"><code>([^<]+)</code>", differences) == ["amount"]
    assert "<code>1250</code>" in differences and "<code>9</code>" in differences
    for title in ("intended-title", "evidence-title"):
        column = _section(html, title)
        flagged = re.findall(r'<tr class="differs"><th scope="row"><code>([^<]+)<', column)
        assert flagged == ["amount"], title
        assert '<span class="differs-label">differs</span>' in column
        assert '<tr><th scope="row"><code>currency</code>' in column  # the same: not flagged
    # The digests differ too, and both columns say so.
    assert _section(html, "intended-title").count('<dd class="differs">') == 1
    assert _section(html, "evidence-title").count('<dd class="differs">') == 1


def test_a_matching_record_flags_nothing(client, operator, stuck):
    stuck.released("op-1")
    client.force_login(operator)
    html = _page(client, "op-1")
    assert "differs" not in html.replace("differs-label", "")
    assert 'id="differences-title"' not in html


def test_a_receipt_that_disagrees_with_the_evidence_is_flagged(client, operator, flow, provider_db):
    flow.approved("op-1", PARAMS)
    token = flow.dispatch("op-1").json()["fencing_token"]
    reported = flow.host_api.post(
        "/api/v1/operations/op-1/result",
        {"fencing_token": token, "outcome": "committed", "provider_reference": "r-host"},
    )
    assert reported.status_code == 200, reported.content
    sqlite_provider_commit(provider_db, operation_key="op-1", params=PARAMS, reference="r-prov")
    client.force_login(operator)
    operation = Operation.objects.get(key="op-1")
    looked = client.post(
        "/operations/op-1/lookup", {"version": operation.version, "reason": "check"}
    )
    assert looked.status_code == 302
    # What the background worker's task runs for the queued lookup:
    lookup_attempt_run(attempt_id=LookupAttempt.objects.get(operation=operation).pk)
    html = _page(client, "op-1")
    evidence, receipt = _section(html, "evidence-title"), _section(html, "receipt-title")
    assert "differs from the receipt" in evidence and "r-prov" in evidence
    assert "differs from the evidence" in receipt and "r-host" in receipt
    assert evidence.count('<dd class="differs">') == receipt.count('<dd class="differs">') == 1


def test_the_live_region_polls_while_a_lookup_is_in_flight_and_stops_after(
    client, operator, stuck, provider_db
):
    operation = stuck.unknown("op-1")
    client.force_login(operator)
    assert 'hx-trigger="every 1s"' not in _page(client, "op-1")  # nothing in flight

    attempt = queue_lookup(operation)
    page = _page(client, "op-1")
    seen = f"{attempt.pk}.queued"
    polling = f'<div id="live" hx-get="/operations/op-1/?seen={seen}" hx-trigger="every 1s"'
    assert polling in page
    assert "A lookup is queued" in page and '<a href="/operations/op-1/">Refresh</a>' in page
    live = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "live"}
    # Nothing new since the page was drawn: 204, which htmx leaves as it is, still polling.
    unchanged = client.get("/operations/op-1/", {"seen": seen}, **live)
    assert unchanged.status_code == 204 and unchanged.content == b""
    # A page that saw something else gets the region alone, redrawn.
    polled = _page(client, "op-1", **live)
    assert polled.lstrip().startswith(polling)
    assert "<html" not in polled
    # The actions are redrawn with it (what may be done, as of which version), each reason
    # marked to keep what the operator is typing (htmx's hx-preserve, by its stable id).
    assert '<div id="actions" hx-swap-oob="true">' in polled
    assert f'name="version" value="{operation.version}"' in polled
    assert re.search(r'<input id="id_reason_lookup" [^>]*hx-preserve>', polled)

    sqlite_provider_commit(provider_db, operation_key="op-1", params=PARAMS, reference="r-1")
    assert lookup_attempt_run(attempt_id=attempt.pk).state == "released"
    done = client.get("/operations/op-1/", {"seen": seen}, **live).content.decode()
    assert done.lstrip().startswith('<div id="live">')  # no trigger: the polling stops
    assert "The lookup finished: the operation is released." in done
    # The state line and the actions (what may be done now, as of which version) are
    # brought up to date with it: a released operation offers no confirm or void.
    assert '<p id="op-state" hx-swap-oob="true"><span class="badge state-released">' in done
    version = Operation.objects.get(key="op-1").version
    assert '<div id="actions" hx-swap-oob="true">' in done
    assert f'name="version" value="{version}"' in done
    assert "Propose void" not in done and "Look up now" in done


def test_a_lookup_whose_lease_lapsed_is_not_waited_for(client, operator, stuck):
    attempt = queue_lookup(stuck.unknown("op-1"))
    LookupAttempt.objects.filter(pk=attempt.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    client.force_login(operator)
    assert 'hx-trigger="every 1s"' not in _page(client, "op-1")


def test_the_live_region_is_the_operations_own_for_another_providers_user(client, outsider, stuck):
    queue_lookup(stuck.unknown("op-1"))
    client.force_login(outsider)
    polled = client.get("/operations/op-1/", HTTP_HX_REQUEST="true", HTTP_HX_TARGET="live")
    assert polled.status_code == 404


def test_the_page_costs_the_same_statements_however_long_the_history(client, operator, stuck):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    operation = stuck.mismatch("op-1")
    client.force_login(operator)

    def statements(**headers: str) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get("/operations/op-1/", **headers).status_code in (200, 204)
        return len(captured.captured_queries)

    statements()  # content types and the like are cached by the first request
    short = statements()
    _append(operation, "note", count=300)
    long = statements()
    # One read per kind of thing: session, user, lookups, the operation (with its
    # dispatch, claim and pending proposal's id), permits, their events, evidence, the
    # chain, the user's permissions (one UNION), the alarm banner.
    assert short == long <= 10
    attempt = queue_lookup(operation)
    live = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "live"}
    with CaptureQueriesContext(connection) as captured:
        response = client.get("/operations/op-1/", {"seen": f"{attempt.pk}.queued"}, **live)
    assert response.status_code == 204
    print(f"page: {long} statements; a poll with nothing new: {len(captured)}")
    assert len(captured) <= 6


def test_a_viewer_polls_too_but_is_sent_no_action_form_field(client, viewer, stuck):
    attempt = queue_lookup(stuck.unknown("op-1"))
    client.force_login(viewer)
    page = _page(client, "op-1")
    assert "A lookup is queued" in page and "Look up now" not in page
    assert lookup_attempt_run(attempt_id=attempt.pk).state == "unknown"  # still nothing there
    done = _page(client, "op-1", HTTP_HX_REQUEST="true", HTTP_HX_TARGET="live")
    assert done.lstrip().startswith('<div id="live">')
    assert 'id="op-state" hx-swap-oob="true"' in done and 'name="version"' not in done
    assert "Look up now" not in done


def test_a_journal_record_without_params_flags_the_digest_and_says_why_no_more(
    client, operator, host_api, approver_api, tmp_path
):
    from harness.providers import journal_append
    from recovery.services.providers import provider_configure
    from tests.support.console import Stuck
    from tests.support.flow import Flow

    journal = tmp_path / "journal.jsonl"
    journal.touch()
    # The operator's provider, configured to read a journal instead of its SQLite file.
    created, _ = provider_configure(name="orders", adapter="journal", path=str(journal))
    stuck = Stuck(Flow(host_api, approver_api, created), journal)
    stuck._lapsed("op-1", PARAMS)
    journal_append(
        journal, operation_key="op-1", params_digest=digest_of({"amount": 9}), reference="j-1"
    )
    assert stuck.flow.resume_looked_up("op-1")["state"] == "reconcile"
    client.force_login(operator)
    html = _page(client, "op-1")
    evidence = _section(html, "evidence-title")
    assert 'verdict-mismatch">mismatch<' in evidence
    assert evidence.count('<dd class="differs">') == 1  # its digest
    assert "holds only the digest of its parameters" in evidence
    assert 'id="differences-title"' not in html
    assert '<tr class="differs">' not in html  # no parameter is singled out


def test_an_operation_never_dispatched_has_a_page_too(client, operator, flow):
    flow.register("op-1", PARAMS)
    client.force_login(operator)
    html = _page(client, "op-1")
    assert "No permit was issued." in html and "Never dispatched." in html
    assert "No lookup yet." in html and "awaiting_approval" in html
    timeline = _section(html, "timeline-title")
    assert "Registered" in timeline


def test_an_event_whose_data_is_not_an_object_still_shows(client, operator, stuck):
    operation = stuck.unknown("op-1")
    with audit_transaction():
        locked = operation_lock(operation)
        audit_append(kind="stale_signal", operation=locked, data=["late", 1])  # type: ignore[arg-type]
    client.force_login(operator)
    section = _section(_page(client, "op-1"), "timeline-title")
    assert "Stale signal, not applied" in section and "&quot;late&quot;" in section


def _permit_with_lines(flow, count: int):
    flow.approved()
    permit = Permit.objects.get(operation_key="op-1")
    now = timezone.now()
    PermitEvent.objects.bulk_create(
        PermitEvent(
            permit=permit,
            kind=PermitEvent.Kind.REVOKE_IGNORED,
            actor=Actor.system("test"),
            detail={"n": n},
            at=now + timedelta(milliseconds=n),
        )
        for n in range(count)
    )
    return permit


def test_the_page_shows_a_permits_newest_lines_and_links_to_older_ones(flow, client, supervisor):
    permit = _permit_with_lines(flow, 120)
    client.force_login(supervisor)
    history = _section(_page(client, "op-1"), "permits-title")
    shown = re.findall(r"n=(\d+)", history)
    assert shown == [str(n) for n in range(120 - PERMIT_LINES, 120)]
    assert "issued" not in history  # the row's lines come with the oldest page
    older = re.search(r'href="([^"]+/history\?before=\d+)"', history)
    assert older is not None
    second = client.get(older.group(1))
    assert second.status_code == 200
    assert re.findall(r"n=(\d+)", second.content.decode()) == [
        str(n) for n in range(120 - 2 * PERMIT_LINES, 120 - PERMIT_LINES)
    ]
    partial = client.get(
        re.search(r'href="([^"]+)"', second.content.decode().split('class="line older"')[1])
        .group(1)
        .replace("&amp;", "&"),
        HTTP_HX_REQUEST="true",
    )
    assert partial.status_code == 200
    body = partial.content.decode()
    assert "<html" not in body and "issued" in body  # the oldest page: the row's lines too
    assert re.findall(r"n=(\d+)", body) == [str(n) for n in range(120 - 2 * PERMIT_LINES)]
    assert f"/operations/op-1/permits/{permit.id}/history" in older.group(1)


def test_a_bad_cursor_for_older_lines_is_refused_with_400(flow, client, supervisor):
    permit = _permit_with_lines(flow, 3)
    client.force_login(supervisor)
    for bad in ("x", "-1", "1" * 19, ""):
        response = client.get(f"/operations/op-1/permits/{permit.id}/history?before={bad}")
        assert response.status_code == 400
        assert b"invalid_cursor" in response.content
    assert client.get("/operations/op-1/permits/not-a-uuid/history?before=1").status_code == 404


def test_older_lines_are_hidden_from_a_user_who_may_not_view_the_provider(flow, client, supervisor):
    permit = _permit_with_lines(flow, 3)
    client.force_login(supervisor)
    assert client.get(f"/operations/op-1/permits/{permit.id}/history?before=9").status_code == 200
    outsider = get_user_model().objects.create_user("outsider", password="x" * 12)
    client.force_login(outsider)
    assert client.get(f"/operations/op-1/permits/{permit.id}/history?before=9").status_code == 404


def test_a_refusal_flood_keeps_the_permit_history_small(flow, settings, client, supervisor):
    settings.SETTLE_REFUSALS_RECORDED_PER_MINUTE = 20
    with time_machine.travel(timezone.now().replace(second=1), tick=False):
        flow.approved()
        assert flow.dispatch().status_code == 200
        for _ in range(300):
            assert flow.dispatch(worker="again").json()["error"] == "already_consumed"
    assert PermitEvent.objects.count() == 21  # 20 one by one, one summary of 280
    client.force_login(supervisor)
    history = _section(_page(client, "op-1"), "permits-title")
    assert "280 more, counted" in history
    assert history.count("kind-refused") == 21
