"""The host API's permit history pages: a first page in the record, then by cursor."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import Permit, PermitEvent
from common.actors import Actor
from recovery import contract

pytestmark = pytest.mark.django_db


def _lines(flow, count: int) -> Permit:
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


def test_the_record_holds_the_first_page_and_links_the_next(flow):
    _lines(flow, contract.HISTORY_PAGE + 30)
    permit = flow.record()["permit"]
    assert len(permit["history"]) == 1 + contract.HISTORY_PAGE  # issued, then events
    assert permit["history"][0]["kind"] == "issued"
    assert permit["history_next"].startswith("/api/v1/operations/op-1/history?after=")


def test_the_history_pages_by_cursor_to_its_end(flow):
    _lines(flow, 25)
    seen, url = [], "/api/v1/operations/op-1/history?limit=10"
    while url:
        response = flow.host_api.get(url)
        assert response.status_code == 200, response.content
        page = response.json()
        seen += [line["detail"].get("n") for line in page["lines"]]
        url = page["next"]
    assert seen == [None, *range(25)]  # issued first, each event once


def test_a_record_with_a_short_history_has_no_next_page(flow):
    flow.approved()
    assert flow.record()["permit"]["history_next"] is None
    page = flow.host_api.get("/api/v1/operations/op-1/history").json()
    assert [line["kind"] for line in page["lines"]] == ["issued"] and page["next"] is None


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ("after=x", "invalid_cursor"),
        ("after=-1", "invalid_cursor"),
        ("after=" + "9" * 19, "invalid_cursor"),
        ("limit=0", "invalid_page_size"),
        (f"limit={contract.HISTORY_PAGE_MAX + 1}", "invalid_page_size"),
        ("limit=ten", "invalid_page_size"),
    ],
)
def test_a_bad_cursor_or_page_size_is_refused_with_400(flow, query, code):
    flow.approved()
    response = flow.host_api.get(f"/api/v1/operations/op-1/history?{query}")
    assert response.status_code == 400
    assert response.json()["error"] == code


def test_another_hosts_operation_history_is_not_found(flow, other_host_api):
    flow.approved()
    assert flow.host_api.get("/api/v1/operations/op-1/history").status_code == 200
    response = other_host_api.get("/api/v1/operations/op-1/history")
    assert response.status_code == 404
    assert response.json()["error"] == "unknown_operation"
