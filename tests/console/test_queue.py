"""The queue: unknown, reconcile and stranded receipts of the providers a user may view."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals.models import Permit
from common.actors import Actor
from harness.providers import digest_of, sqlite_provider_commit, sqlite_provider_tamper
from recovery.models import Dispatch, Evidence, Operation, Provider
from recovery.selectors.queue import QueueFilters, operations_queue_for_user
from recovery.services.roles import role_grant
from tests.support.console import aged, console_user
from tests.support.flow import PARAMS

pytestmark = pytest.mark.django_db


def _keys(response) -> list[str]:
    """The operation keys listed, in order."""
    html = response.content.decode()
    return re.findall(r'<a class="key" href="/operations/[^"]+/">([^<]+)</a>', html)


def _next_page(response) -> str:
    """The query of the next page's link."""
    (query,) = re.findall(r'<a href="\?([^"]+)" hx-get', response.content.decode())
    return query.replace("&amp;", "&")


def test_the_queue_shows_what_waits_with_why_and_the_last_lookup(signed_in, operator, stuck):
    stuck.unknown("op-unknown")
    stuck.mismatch("op-mismatch")
    stuck.released("op-settled")
    page = signed_in(operator).get("/")
    assert page.status_code == 200
    assert _keys(page) == ["op-unknown", "op-mismatch"]
    html = page.content.decode()
    assert "payment.send" in html and ">orders<" in html
    assert 'class="badge state-unknown">unknown<' in html
    assert 'class="badge state-reconcile">reconcile<' in html
    assert "Evidence mismatch" in html  # why the second one waits
    assert 'verdict-absent">absent<' in html and 'verdict-mismatch">mismatch<' in html
    assert html.count('class="badge stranded"') == 2  # both workers died holding them
    # Ages are relative, with the exact UTC time on hover.
    assert re.search(r'<time datetime="[^"]+Z" title="\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC">', html)
    counts = re.sub(r"\s+", " ", html)
    assert "Unknown <strong>1</strong>" in counts and "Reconcile <strong>1</strong>" in counts


def test_a_stranded_receipt_of_a_settled_operation_is_in_the_queue(signed_in, operator, stuck):
    stranded = stuck.unknown("op-stranded")
    # Settled while its receipt still says running (as an operator's void will leave it):
    # the test stands in for a transition the console does not offer yet.
    Operation.objects.filter(pk=stranded.pk).update(state="voided")
    page = signed_in(operator).get("/")
    assert _keys(page) == ["op-stranded"]
    assert "Receipt still running" in page.content.decode()
    assert _keys(signed_in(operator).get("/?state=stranded")) == ["op-stranded"]
    assert _keys(signed_in(operator).get("/?state=unknown")) == []


def test_oldest_first(signed_in, operator, stuck):
    aged(stuck.unknown("op-new"), minutes=1)
    aged(stuck.unknown("op-old"), minutes=90)
    aged(stuck.mismatch("op-middle"), minutes=30)
    assert _keys(signed_in(operator).get("/")) == ["op-old", "op-middle", "op-new"]


def test_a_viewer_sees_the_queue_of_their_provider(signed_in, viewer, stuck):
    stuck.unknown("op-1")
    assert _keys(signed_in(viewer).get("/")) == ["op-1"]


def test_another_providers_operations_are_not_listed_nor_counted(
    signed_in, outsider, operator, stuck, other_stuck
):
    stuck.unknown("orders-1")
    other_stuck.unknown("ledger-1")
    page = signed_in(outsider).get("/")
    assert _keys(page) == ["ledger-1"]
    assert "orders-1" not in page.content.decode()
    assert "Unknown <strong>1</strong>" in re.sub(r"\s+", " ", page.content.decode())
    # Even when asked for by name.
    assert _keys(signed_in(outsider).get("/?provider=orders")) == ["ledger-1"]
    assert _keys(signed_in(outsider).get("/?q=orders-1")) == []
    assert _keys(signed_in(operator).get("/")) == ["orders-1"]


def test_a_user_without_a_role_sees_an_empty_queue(signed_in, stuck):
    stuck.unknown("op-1")
    page = signed_in(console_user("nobody")).get("/")
    assert page.status_code == 200
    assert _keys(page) == []
    assert "no role on any provider yet" in page.content.decode()


def test_a_grant_takes_effect_on_the_next_request(signed_in, provider, stuck):
    stuck.unknown("op-1")
    late = console_user("late")
    client = signed_in(late)
    assert _keys(client.get("/")) == []
    role_grant(user=late, role="viewer", provider=provider, actor=Actor.system("test"))
    assert _keys(client.get("/")) == ["op-1"]


def test_the_queue_answers_405_to_a_post(signed_in, operator):
    assert signed_in(operator).post("/").status_code == 405


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("state=unknown", ["op-a", "op-b", "ledger-1"]),
        ("state=reconcile", ["op-c"]),
        ("verdict=mismatch", ["op-c"]),
        ("verdict=absent", ["op-a", "op-b", "ledger-1"]),
        ("verdict=none", []),
        ("q=op-b", ["op-b"]),
        ("q=-b", []),  # a key's start, not any part of it
        ("q=op&state=reconcile", ["op-c"]),
        ("provider=orders", ["op-a", "op-b", "op-c"]),
        ("provider=ledger", ["ledger-1"]),
    ],
)
def test_filters_combine_and_live_in_the_url(
    signed_in, provider, other_provider, stuck, other_stuck, query, expected
):
    user = console_user("both", "operator", provider)
    role_grant(user=user, role="viewer", provider=other_provider, actor=Actor.system("test"))
    aged(stuck.unknown("op-a"), minutes=30)
    aged(stuck.unknown("op-b"), minutes=20)
    aged(stuck.mismatch("op-c"), minutes=10)
    aged(other_stuck.unknown("ledger-1"), minutes=5)
    page = signed_in(user).get(f"/?{query}")
    assert _keys(page) == expected
    name, _, value = query.partition("&")[0].partition("=")
    assert f'value="{value}" selected' in page.content.decode() or name == "q"


@pytest.mark.parametrize(
    "query", ["state=lost", "verdict=maybe", "provider=nowhere", "after=zzz", "after=1.x"]
)
def test_a_bad_filter_is_shown_and_dropped_never_a_500(signed_in, operator, stuck, query):
    stuck.unknown("op-1")
    page = signed_in(operator).get(f"/?{query}")
    assert page.status_code == 200
    assert "Ignored:" in page.content.decode()
    assert _keys(page) == ["op-1"]


def test_keyset_pages_cover_the_queue_once_oldest_first(operator, stuck):
    for minutes, key in enumerate(["e", "d", "c", "b", "a"]):
        aged(stuck.unknown(f"op-{key}"), minutes=minutes + 1)
    aged(stuck.mismatch("op-z"), minutes=3)  # a tie on the minute is broken by id
    seen, after = [], None
    while True:
        page = operations_queue_for_user(
            user=operator, filters=QueueFilters(), after=after, limit=2
        )
        seen.append([row.key for row in page.rows])
        if page.next_after is None:
            break
        after = page.next_after
    assert seen == [["op-a", "op-b"], ["op-c", "op-z"], ["op-d", "op-e"]]


def test_the_next_page_link_carries_the_filters(signed_in, operator, stuck, monkeypatch):
    from console.views import queue

    monkeypatch.setattr(queue, "PAGE_SIZE", 2)
    for minutes, key in enumerate(["c", "b", "a"]):
        aged(stuck.unknown(f"op-{key}"), minutes=minutes + 1)
    client = signed_in(operator)
    first = client.get("/?state=unknown")
    assert _keys(first) == ["op-a", "op-b"]
    link = _next_page(first)
    assert link.startswith("state=unknown&after=")
    second = client.get(f"/?{link}")
    assert _keys(second) == ["op-c"]
    assert 'href="?state=unknown">First page' in second.content.decode()


def test_an_htmx_request_gets_only_the_results(signed_in, operator, stuck):
    stuck.unknown("op-1")
    page = signed_in(operator).get("/?state=unknown", HTTP_HX_REQUEST="true")
    html = page.content.decode()
    assert html.lstrip().startswith('<div id="results">')
    assert "<html" not in html and _keys(page) == ["op-1"]


def test_the_page_costs_the_same_statements_whatever_the_size_and_depth(
    signed_in, operator, stuck, monkeypatch
):
    from console.views import queue

    monkeypatch.setattr(queue, "PAGE_SIZE", 2)
    client = signed_in(operator)
    stuck.unknown("op-1")

    def statements(path: str) -> list[str]:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(path).status_code == 200
        return [q["sql"] for q in captured.captured_queries]

    small = statements("/")
    for n in range(2, 7):
        stuck.unknown(f"op-{n}")
    large = statements("/")
    deep = statements("/?" + _next_page(client.get("/")))
    assert len(small) == len(large) == len(deep) <= 10
    for sql in large + deep:
        assert "OFFSET" not in sql.upper()
        # The only counts are grouped by state or over running receipts.
        if "COUNT(" in sql.upper() and '"recovery_operation"."state"' not in sql:
            assert "receipt_status" in sql or "recovery_lookupattempt" in sql


def test_a_superuser_sees_every_providers_queue(signed_in, stuck, other_stuck):
    stuck.unknown("orders-1")
    other_stuck.unknown("ledger-1")
    root = User.objects.create_superuser("root", "root@example.com", "unused-pw-0123")
    assert sorted(_keys(signed_in(root).get("/"))) == ["ledger-1", "orders-1"]


def test_an_empty_queue_says_nothing_waits(signed_in, operator, stuck):
    stuck.released("op-1")
    assert "Nothing waits." in signed_in(operator).get("/").content.decode()
    assert "Nothing waits that matches" in signed_in(operator).get("/?q=zz").content.decode()


# -- why it waits, how long, and a search that jumps ------------------------------------


def _corrupt(stuck, key: str) -> Operation:
    """The provider's receipt cannot be parsed: reconcile, evidence corrupt."""
    stuck._lapsed(key, PARAMS)
    sqlite_provider_commit(stuck.provider_db, operation_key=key, params=PARAMS, reference="c-1")
    sqlite_provider_tamper(stuck.provider_db, key, "bad_json")
    assert stuck.flow.resume_looked_up(key)["state"] == "reconcile"
    return Operation.objects.get(key=key)


def _budget_spent(stuck, provider, key: str) -> Operation:
    """Nothing at the provider, lookup after lookup, until the budget is spent: reconcile."""
    Provider.objects.filter(pk=provider.pk).update(lookup_budget=1)
    stuck._lapsed(key, PARAMS)
    assert stuck.flow.resume_looked_up(key)["state"] == "reconcile"
    Provider.objects.filter(pk=provider.pk).update(lookup_budget=5)
    return Operation.objects.get(key=key)


@pytest.fixture
def reasons(stuck, provider):
    stuck.unknown("op-lapsed")
    stuck.mismatch("op-mismatch")
    _corrupt(stuck, "op-corrupt")
    _budget_spent(stuck, provider, "op-budget")
    voided = stuck.unknown("op-stranded")
    Operation.objects.filter(pk=voided.pk).update(state="voided")  # as in the test above
    for minutes, key in enumerate(
        ["op-lapsed", "op-mismatch", "op-corrupt", "op-budget", "op-stranded"]
    ):
        aged(Operation.objects.get(key=key), minutes=50 - minutes)


@pytest.mark.parametrize(
    ("reason", "expected", "label"),
    [
        ("lease_lost", ["op-lapsed"], "Worker&#x27;s lease lapsed"),
        ("mismatch", ["op-mismatch"], "Evidence mismatch"),
        ("corrupt", ["op-corrupt"], "Evidence corrupt"),
        ("lookup_budget_spent", ["op-budget"], "Lookups inconclusive, budget spent"),
        ("stranded", ["op-stranded"], "Receipt still running"),
        ("conflict", [], ""),
    ],
)
def test_the_reason_filter_keeps_what_waits_for_that_reason(
    signed_in, operator, reasons, reason, expected, label
):
    page = signed_in(operator).get(f"/?reason={reason}")
    assert _keys(page) == expected
    html = page.content.decode()
    assert f'<option value="{reason}" selected>' in html
    if label:
        assert f'<td data-label="Reason">{label}</td>' in html


def test_every_row_says_why_it_waits(signed_in, operator, reasons):
    html = signed_in(operator).get("/").content.decode()
    why = re.findall(r'<td data-label="Reason">([^<]+)</td>', html)
    assert why == [
        "Worker&#x27;s lease lapsed",
        "Evidence mismatch",
        "Evidence corrupt",
        "Lookups inconclusive, budget spent",
        "Receipt still running",
    ]


@pytest.mark.parametrize(
    ("age", "expected"),
    [
        ("hour", ["op-new"]),
        ("day", ["op-hours"]),
        ("week", ["op-days"]),
        ("older", ["op-weeks"]),
        ("", ["op-weeks", "op-days", "op-hours", "op-new"]),
    ],
)
def test_the_age_filter_keeps_what_has_waited_that_long(signed_in, operator, stuck, age, expected):
    aged(stuck.unknown("op-new"), minutes=20)
    aged(stuck.unknown("op-hours"), minutes=5 * 60)
    aged(stuck.mismatch("op-days"), minutes=3 * 24 * 60)
    aged(stuck.unknown("op-weeks"), minutes=10 * 24 * 60)
    assert _keys(signed_in(operator).get(f"/?age={age}")) == expected


def test_reason_and_age_combine_with_keyset_pages(operator, stuck):
    for minutes, key in enumerate(["c", "b", "a"]):
        aged(stuck.unknown(f"op-{key}"), minutes=90 + minutes)
    aged(stuck.mismatch("op-m"), minutes=91)
    aged(stuck.unknown("op-fresh"), minutes=5)
    filters = QueueFilters(reason="lease_lost", age="day")
    first = operations_queue_for_user(user=operator, filters=filters, after=None, limit=2)
    assert [row.key for row in first.rows] == ["op-a", "op-b"]
    second = operations_queue_for_user(
        user=operator, filters=filters, after=first.next_after, limit=2
    )
    assert [row.key for row in second.rows] == ["op-c"] and second.next_after is None


@pytest.mark.parametrize("query", ["reason=bored", "age=forever"])
def test_a_bad_reason_or_age_is_shown_and_dropped(signed_in, operator, stuck, query):
    stuck.unknown("op-1")
    page = signed_in(operator).get(f"/?{query}")
    assert page.status_code == 200 and "Ignored:" in page.content.decode()
    assert _keys(page) == ["op-1"]


def _ids(key: str) -> dict[str, str]:
    permit = Permit.objects.get(operation_key=key)
    return {
        "key": key,
        "permit": str(permit.id),
        "dispatch permit": str(Dispatch.objects.get(operation__key=key).permit_id),
        "approval": str(permit.approval_id),
        "reference": Evidence.objects.get(operation__key=key).provider_reference,
    }


@pytest.mark.parametrize("kind", ["key", "permit", "dispatch permit", "approval", "reference"])
def test_a_searched_exact_id_opens_its_operation(signed_in, operator, stuck, kind):
    stuck.unknown("op-a")
    stuck.mismatch("op-b")  # its provider's record has reference x-1
    stuck.unknown("op-b-2")
    text = _ids("op-b")[kind]
    client = signed_in(operator)
    response = client.get("/", {"q": text, "jump": "1"})
    assert response.status_code == 302 and response["Location"] == "/operations/op-b/"
    # From htmx, the whole page goes there, not the results pane.
    swapped = client.get("/", {"q": text, "jump": "1"}, HTTP_HX_REQUEST="true")
    assert swapped.status_code == 200 and swapped["HX-Redirect"] == "/operations/op-b/"
    # Typing alone filters and never jumps: op-b is also the start of op-b-2.
    typed = client.get("/", {"q": text})
    assert typed.status_code == 200
    assert _keys(typed) == (["op-b", "op-b-2"] if kind == "key" else [])


def test_a_search_that_names_no_one_operation_filters_by_key(signed_in, operator, stuck):
    stuck.mismatch("op-1")
    stuck.mismatch("op-2")  # both provider records have reference x-1
    client = signed_in(operator)
    shared = client.get("/", {"q": "x-1", "jump": "1"})
    assert shared.status_code == 200 and _keys(shared) == []
    prefix = client.get("/", {"q": "op-", "jump": "1"})
    assert prefix.status_code == 200 and _keys(prefix) == ["op-1", "op-2"]
    unknown_id = client.get("/", {"q": "6f1c0a4e-0000-4000-8000-000000000000", "jump": "1"})
    assert unknown_id.status_code == 200 and _keys(unknown_id) == []


def test_a_search_never_reveals_another_providers_operation(
    signed_in, outsider, stuck, other_stuck
):
    stuck.mismatch("orders-1")  # reference x-1, at the orders provider
    other_stuck.unknown("ledger-1")
    client = signed_in(outsider)
    for kind, text in _ids("orders-1").items():
        response = client.get("/", {"q": text, "jump": "1"})
        assert response.status_code == 200, kind
        assert _keys(response) == [], kind
        assert "/operations/orders-1/" not in response.content.decode(), kind
    # A reference shared with a hidden operation still names the visible one alone.
    other_stuck.mismatch("ledger-2")  # its record has reference x-1 too
    response = client.get("/", {"q": "x-1", "jump": "1"})
    assert response.status_code == 302 and response["Location"] == "/operations/ledger-2/"


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("state=stranded&reason=lease_lost", ["op-lapsed"]),  # unknown, its receipt running
        ("state=stranded&reason=stranded", ["op-stranded"]),
        ("state=reconcile&reason=stranded", []),
        ("state=unknown&reason=mismatch", []),
    ],
)
def test_reason_combines_with_state(signed_in, operator, reasons, query, expected):
    assert _keys(signed_in(operator).get(f"/?{query}")) == expected


def test_the_queue_shows_who_claimed_an_operation_until_the_claim_lapses(
    signed_in, operator, stuck, settings
):
    import time_machine
    from django.utils import timezone

    from recovery.services.operator import operation_claim

    claimed = stuck.unknown("op-claimed")
    stuck.mismatch("op-free")
    operation_claim(operation=claimed, actor=Actor.of("user", operator))
    html = signed_in(operator).get("/").content.decode()
    rows = dict(
        re.findall(r'>(op-[a-z]+)</a></td>.*?data-label="Claimed by">(.*?)</td>', html, re.S)
    )
    assert rows["op-claimed"] == "olivia"
    assert "—" in rows["op-free"]
    idle = settings.SETTLE_CLAIM_IDLE_MINUTES + 1
    with time_machine.travel(timezone.now() + timezone.timedelta(minutes=idle)):
        html = signed_in(operator).get("/").content.decode()
    rows = dict(
        re.findall(r'>(op-[a-z]+)</a></td>.*?data-label="Claimed by">(.*?)</td>', html, re.S)
    )
    assert "—" in rows["op-claimed"]


# -- the stranded mark (Operation.receipt_running) that the stranded branch reads -------


def test_an_operation_whose_worker_died_is_marked_as_holding_a_running_receipt(stuck):
    assert stuck.unknown("op-1").receipt_running is True


def test_a_release_from_matching_evidence_completes_the_receipt_and_clears_the_mark(stuck):
    # The receipt is completed after the transition, in the same transaction: the
    # transition itself says so, or every recovered operation would stay marked.
    operation = stuck.released("op-1")
    assert operation.dispatch.receipt_status == "succeeded"
    assert operation.receipt_running is False


def test_a_worker_that_reports_in_time_leaves_no_mark(flow):
    flow.approved("op-1", PARAMS)
    token = flow.dispatch("op-1", digest_of(PARAMS), worker="w-1").json()["fencing_token"]
    report = {"fencing_token": token, "outcome": "committed"}
    assert flow.host_api.post("/api/v1/operations/op-1/result", report).status_code == 200
    operation = Operation.objects.get(key="op-1")
    assert (operation.state, operation.receipt_running) == ("released", False)


def test_a_repaired_receipt_clears_the_mark(signed_in, operator, stuck):
    operation = stuck.released("op-1")
    # Stranded as a settlement without its receipt leaves it (the transition marked it).
    Dispatch.objects.filter(operation=operation).update(
        receipt_status="running", receipt_recovered=False, receipt_evidence=None
    )
    Operation.objects.filter(pk=operation.pk).update(receipt_running=True)
    assert _keys(signed_in(operator).get("/")) == ["op-1"]
    answer = signed_in(operator).post(
        "/operations/op-1/repair", {"version": operation.version, "reason": "provider says so"}
    )
    assert answer.status_code == 302
    assert Operation.objects.get(pk=operation.pk).receipt_running is False
    assert _keys(signed_in(operator).get("/")) == []


def test_the_queue_escapes_what_hosts_wrote(signed_in, operator, stuck):
    """The rows are written by ``queue_rows``, not by the template's autoescape."""
    op = stuck.unknown("op-1")
    Operation.objects.filter(pk=op.pk).update(action='<script>alert("x")</script>')
    html = signed_in(operator).get("/").content.decode()
    assert "<script>alert" not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html


def test_the_counts_stop_at_the_cap_and_say_so(signed_in, operator, stuck, monkeypatch):
    from recovery.selectors import queue

    monkeypatch.setattr(queue, "QUEUE_COUNT_CAP", 2)
    for n in range(3):
        stuck.unknown(f"op-u{n}")
    stuck.mismatch("op-r")
    stranded = stuck.unknown("op-settled")
    Operation.objects.filter(pk=stranded.pk).update(state="voided", receipt_running=True)
    # Four unknown-or-stranded receipts would be five; each count stops at cap + 1.
    counts = queue.operations_queue_counts_for_user(user=operator)
    assert counts == {"unknown": 3, "reconcile": 1, "stranded": 3}
    page = queue.operations_queue_for_user(
        user=operator, filters=QueueFilters(), after=None, limit=50, counted=True
    )
    assert page.counts == counts
    assert len(page.rows) == 5


def test_the_counts_come_with_an_empty_page_too(signed_in, operator, stuck):
    stuck.unknown("op-1")
    page = operations_queue_for_user(
        user=operator, filters=QueueFilters(search="nothing"), after=None, limit=50, counted=True
    )
    assert page.rows == [] and page.next_after is None
    assert page.counts == {"unknown": 1, "reconcile": 0, "stranded": 1}
    # Filters no branch can hold (a reconcile that waits for its receipt alone).
    page = operations_queue_for_user(
        user=operator,
        filters=QueueFilters(state="reconcile", reason="stranded"),
        after=None,
        limit=50,
        counted=True,
    )
    assert page.rows == [] and page.counts == {"unknown": 1, "reconcile": 0, "stranded": 1}
