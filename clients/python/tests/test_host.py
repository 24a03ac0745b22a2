"""Host.run, its context-manager form and AsyncHost against a live Settle.

Each request and answer is checked against the server's API document (api_contract).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import threading
import time
from typing import Any

import httpx
import pytest
import settle_client
from api_contract import AsyncContractTransport, Contract, ContractTransport
from settle_client import errors

PARAMS = {"amount": 1250, "currency": "EUR", "to": "acct-7", "rate": 1.5}


def make_host(server: dict[str, str], transport: httpx.BaseTransport, **kw: Any) -> Any:
    return settle_client.Host(server["url"], server["host_token"], transport=transport, **kw)


def make_approver(server: dict[str, str], contract: Contract) -> settle_client.Approver:
    return settle_client.Approver(
        server["url"], server["approver_token"], transport=ContractTransport(contract)
    )


def test_run_waits_for_the_approval_runs_the_effect_once_and_is_released(
    server: dict[str, str], contract: Contract, transport: ContractTransport, key: str
) -> None:
    calls: list[str] = []
    approver = make_approver(server, contract)
    with make_host(server, transport) as host:
        outcome = host.run(
            key,
            action="payment.send",
            provider=server["provider"],
            params=PARAMS,
            effect=lambda token: calls.append(token) or f"pay-{key}",
            on_approval=approver.approve,
        )
        again = host.run(
            key,
            action="payment.send",
            provider=server["provider"],
            params=PARAMS,
            effect=lambda token: calls.append(token),
        )
        record = host.operation(key)

    assert (outcome.state, outcome.recovered, outcome.ran_effect) == ("released", False, True)
    assert outcome.reference == f"pay-{key}"
    assert (again.state, again.ran_effect) == ("released", False)
    assert len(calls) == 1
    assert record["receipt"]["provider_reference"] == f"pay-{key}"
    assert record["params_digest"] == settle_client.params_digest(PARAMS)


class CountingTransport(ContractTransport):
    """Checks each exchange against the contract and keeps its method and path."""

    def __init__(self, contract: Contract) -> None:
        super().__init__(contract)
        self.sent: list[tuple[str, str]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append((request.method, request.url.path))
        return super().handle_request(request)


def test_run_opens_the_approval_with_the_registration(
    server: dict[str, str], contract: Contract, key: str
) -> None:
    transport = CountingTransport(contract)
    approver = make_approver(server, contract)
    with make_host(server, transport) as host:
        outcome = host.run(
            key,
            action="payment.send",
            provider=server["provider"],
            params=PARAMS,
            effect=lambda token: f"pay-{key}",
            on_approval=approver.approve,
        )
    assert outcome.state == "released"
    paths = [path for _, path in transport.sent]
    assert paths[0] == "/api/v1/operations"
    assert not any(path.endswith("/approvals") for path in paths)  # one request, not two


def test_an_effect_that_raises_is_reported_failed_and_carried_by_the_outcome(
    server: dict[str, str], contract: Contract, transport: ContractTransport, key: str
) -> None:
    def effect(token: str) -> str:
        raise RuntimeError("card declined")

    with make_host(server, transport) as host:
        outcome = host.run(
            key,
            action="payment.send",
            provider=server["provider"],
            params=PARAMS,
            effect=effect,
            on_approval=make_approver(server, contract).approve,
        )
    assert outcome.state == "failed" and outcome.ran_effect
    assert isinstance(outcome.error, RuntimeError)


def test_the_context_manager_form_runs_its_body_once(
    server: dict[str, str], contract: Contract, transport: ContractTransport, key: str
) -> None:
    approver = make_approver(server, contract)
    bodies = 0
    with make_host(server, transport) as host:
        for _ in range(2):
            with host.action(
                key,
                action="payment.send",
                provider=server["provider"],
                params=PARAMS,
                on_approval=approver.approve,
            ) as attempt:
                if attempt.fencing_token is not None:
                    bodies += 1
                    attempt.reference = "ref-cm"
            assert attempt.outcome is not None and attempt.outcome.state == "released"
    assert bodies == 1


def test_a_denied_approval_raises_approval_denied(
    server: dict[str, str], contract: Contract, transport: ContractTransport, key: str
) -> None:
    approver = make_approver(server, contract)
    with make_host(server, transport) as host, pytest.raises(errors.ApprovalDenied) as denied:
        host.run(
            key,
            action="payment.send",
            provider=server["provider"],
            params=PARAMS,
            effect=lambda token: pytest.fail("a denied action ran"),
            on_approval=approver.deny,
        )
    assert denied.value.state == "denied"


def test_nobody_deciding_in_time_raises_approval_timeout(
    server: dict[str, str], transport: ContractTransport, key: str
) -> None:
    host = make_host(server, transport, approval_timeout=0.3, poll_interval=0.1)
    with host, pytest.raises(errors.ApprovalTimeout) as waited:
        host.run(
            key,
            action="payment.send",
            provider=server["provider"],
            params=PARAMS,
            effect=lambda token: pytest.fail("ran without approval"),
        )
    assert waited.value.approval_id


def test_an_approval_a_policy_approves_as_it_opens_runs_at_once(
    server: dict[str, str], contract: Contract, key: str
) -> None:
    asked: list[str] = []
    transport = CountingTransport(contract)
    with make_host(server, transport, approval_timeout=5) as host:
        outcome = host.run(
            key,
            action="policy.auto",
            provider=server["provider"],
            params=PARAMS,
            effect=lambda token: f"auto-{key}",
            on_approval=asked.append,
        )
    assert (outcome.state, outcome.ran_effect) == ("released", True)
    assert asked == []  # nobody was asked: the policy decided
    # Registered, opened and dispatched in one request; then the report.
    assert [path for _, path in transport.sent] == [
        "/api/v1/operations",
        f"/api/v1/operations/{key}/result",
    ]


def test_a_quorum_still_pending_says_its_rule_and_what_it_needs(
    server: dict[str, str], contract: Contract, transport: ContractTransport, key: str
) -> None:
    approver = make_approver(server, contract)
    decided: list[settle_client.Decided] = []
    host = make_host(server, transport, approval_timeout=0.3, poll_interval=0.1)
    with host, pytest.raises(errors.ApprovalTimeout) as waited:
        host.run(
            key,
            action="policy.pair",
            provider=server["provider"],
            params=PARAMS,
            effect=lambda token: pytest.fail("ran with one of two approvals"),
            on_approval=lambda approval_id: decided.append(approver.approve(approval_id)),
        )
    assert (waited.value.rule, waited.value.needed) == ("client-pair", "0 of 2 approvals")
    assert "client-pair" in str(waited.value)
    assert (decided[0].status, decided[0].needed) == ("pending", "1 of 2 approvals")
    approval = approver.approval(waited.value.approval_id)
    assert (approval.rule, approval.required, approval.approvals) == ("client-pair", 2, 1)
    with pytest.raises(errors.AlreadyVoted):
        approver.approve(waited.value.approval_id)


def test_the_same_key_for_other_params_is_a_typed_key_conflict(
    server: dict[str, str], transport: ContractTransport, key: str
) -> None:
    with make_host(server, transport, approval_timeout=0.1) as host:
        with pytest.raises(errors.ApprovalTimeout):
            host.run(key, action="a", provider=server["provider"], params={"n": 1}, effect=str)
        with pytest.raises(errors.KeyConflict) as conflict:
            host.run(key, action="a", provider=server["provider"], params={"n": 2}, effect=str)
    assert conflict.value.status == 409 and conflict.value.code == "key_conflict"


def test_params_settle_would_refuse_are_refused_before_any_request(
    server: dict[str, str], contract: Contract, transport: ContractTransport, key: str
) -> None:
    before = len(contract.checked)
    with make_host(server, transport) as host, pytest.raises(errors.InvalidParams) as refused:
        host.run(key, action="a", provider=server["provider"], params={"n": 2**53}, effect=str)
    assert refused.value.details["reason"] == "integer_out_of_range"
    assert len(contract.checked) == before


def test_every_error_code_of_the_api_document_has_its_exception(contract: Contract) -> None:
    codes = contract.document["components"]["schemas"]["Error"]["properties"]["error"]["enum"]
    assert sorted(errors.ERRORS_BY_CODE) == sorted(codes)
    for code in codes:
        error = errors.api_error(409, {"error": code, "message": "m"})
        assert type(error) is errors.ERRORS_BY_CODE[code] and error.code == code


def test_an_approver_decides_with_the_digest_it_saw(
    server: dict[str, str], contract: Contract, transport: ContractTransport, key: str
) -> None:
    seen: list[settle_client.Approval] = []
    approver = make_approver(server, contract)

    def review(approval_id: str) -> None:
        approval = approver.approval(approval_id)
        seen.append(approval)
        other = dataclasses.replace(approval, params_digest="sha256:" + "0" * 64)
        with pytest.raises(errors.DigestMismatch):
            approver.decide(other, approve=True)
        approver.decide(approval, approve=True)

    with make_host(server, transport) as host:
        outcome = host.run(
            key,
            action="payment.send",
            provider=server["provider"],
            params=PARAMS,
            effect=lambda token: None,
            on_approval=review,
        )
    assert outcome.state == "released"
    assert seen[0].params == PARAMS and seen[0].action == "payment.send"
    assert seen[0].digest_verified


class DroppingTransport(ContractTransport):
    """Breaks the connection once for each request whose path ends with a given suffix.

    ``after_sending``: the server receives and applies the request, its answer is lost.
    """

    def __init__(self, contract: Contract, suffixes: tuple[str, ...], after_sending: bool):
        super().__init__(contract)
        self.pending = set(suffixes)
        self.after_sending = after_sending
        self.sent: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request.url.path)
        suffix = next((s for s in self.pending if request.url.path.endswith(s)), None)
        if suffix is None:
            return super().handle_request(request)
        self.pending.discard(suffix)
        if self.after_sending:
            super().handle_request(request).close()
            raise httpx.ReadError("connection reset after the request was sent")
        raise httpx.ConnectError("connection refused")


class HeartbeatCounting(ContractTransport):
    def __init__(self, contract: Contract) -> None:
        super().__init__(contract)
        self.beats: list[int] = []  # the status of each heartbeat

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.url.path.endswith("/heartbeat"):
            self.beats.append(response.status_code)
        return response


def test_heartbeats_run_only_while_an_effect_outlasts_the_interval(
    server: dict[str, str], contract: Contract, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(settle_client.host, "WATCH_IDLE_SECONDS", 0.2)
    transport = HeartbeatCounting(contract)
    approver = make_approver(server, contract)
    watched: list[bool] = []  # whether the watch ran while the slow effect began

    def heartbeat_threads(token: str) -> str:
        return ",".join(t.name for t in threading.enumerate() if "heartbeat-client" in t.name)

    with make_host(server, transport, heartbeat_interval=0.3) as host:
        quick = host.run(
            f"{key}-quick",
            action="payment.send",
            provider=server["provider"],
            params=PARAMS,
            effect=heartbeat_threads,
            on_approval=approver.approve,
        )
        # Over before the first heartbeat was due: no thread was started for it.
        assert quick.released and quick.reference == "" and transport.beats == []
        slow = host.run(
            key,
            action="payment.send",
            provider=server["provider"],
            params=PARAMS,
            effect=lambda token: watched.append(host.watch.thread is not None) or time.sleep(1),
            on_approval=approver.approve,
        )
        beats_at_the_end = len(transport.beats)
        time.sleep(0.5)  # none after the run: its heartbeat stopped with the report
        # With no first beat to wait for during WATCH_IDLE_SECONDS, the watch ended too.
        assert watched == [True] and host.watch.thread is None
    assert slow.released and slow.ran_effect
    assert 2 <= beats_at_the_end <= 4 and set(transport.beats) == {200}, transport.beats
    assert len(transport.beats) == beats_at_the_end


def test_idempotent_calls_are_sent_again_after_a_broken_connection(
    server: dict[str, str], contract: Contract, key: str
) -> None:
    transport = DroppingTransport(contract, ("/operations", "/result"), after_sending=True)
    with make_host(server, transport) as host:
        outcome = host.run(
            key,
            action="payment.send",
            provider=server["provider"],
            params=PARAMS,
            effect=lambda token: "ref",
            on_approval=make_approver(server, contract).approve,
        )
    assert outcome.state == "released" and outcome.ran_effect
    assert sum(path == "/api/v1/operations" for path in transport.sent) == 2
    assert sum(path.endswith("/result") for path in transport.sent) == 2


def test_a_dispatch_is_never_sent_again_resume_settles_it(
    server: dict[str, str], contract: Contract, key: str
) -> None:
    calls: list[str] = []
    transport = DroppingTransport(contract, ("/dispatch",), after_sending=False)
    with make_host(server, transport) as host:
        outcome = host.run(
            key,
            action="payment.send",
            provider=server["provider"],
            params=PARAMS,
            effect=lambda token: calls.append(token) or "ref",
            on_approval=make_approver(server, contract).approve,
        )
    assert sum(path.endswith("/dispatch") for path in transport.sent) == 1
    # Resume found the operation approved and handed this worker its one dispatch.
    assert outcome.state == "released" and len(calls) == 1


def test_settle_out_of_reach_is_a_transport_error_after_the_retries(key: str) -> None:
    with (
        socket_closed_port() as url,
        settle_client.Host(url, "t", retries=2) as host,
        pytest.raises(errors.TransportError),
    ):
        host.run(key, action="a", provider="p", params={}, effect=str)


def socket_closed_port() -> Any:
    import contextlib
    import socket

    @contextlib.contextmanager
    def closed() -> Any:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        yield f"http://127.0.0.1:{port}"

    return closed()


def test_async_host_runs_an_async_effect_once(
    server: dict[str, str], contract: Contract, key: str
) -> None:
    calls: list[str] = []

    async def effect(token: str) -> str:
        await asyncio.sleep(0.01)
        calls.append(token)
        return "async-ref"

    async def main() -> tuple[settle_client.Outcome, settle_client.Outcome]:
        approver = settle_client.AsyncApprover(
            server["url"], server["approver_token"], transport=AsyncContractTransport(contract)
        )
        approvals: list[str] = []
        async with settle_client.AsyncHost(
            server["url"],
            server["host_token"],
            transport=AsyncContractTransport(contract),
            poll_interval=0.1,
        ) as host:
            task = asyncio.create_task(
                host.run(
                    key,
                    action="payment.send",
                    provider=server["provider"],
                    params=PARAMS,
                    effect=effect,
                    on_approval=approvals.append,
                )
            )
            while not approvals:
                await asyncio.sleep(0.05)
            await approver.approve(approvals[0])
            first = await task
            second = await host.run(
                key,
                action="payment.send",
                provider=server["provider"],
                params=PARAMS,
                effect=effect,
            )
        await approver.aclose()
        return first, second

    first, second = asyncio.run(main())
    assert (first.state, first.ran_effect, first.reference) == ("released", True, "async-ref")
    assert (second.state, second.ran_effect) == ("released", False)
    assert len(calls) == 1


@pytest.mark.skipif(
    not os.environ.get("SETTLE_CALLBACK_PROVIDER"), reason="SETTLE_CALLBACK_PROVIDER is not set"
)
def test_a_provider_callback_signed_by_the_helper_is_applied(
    server: dict[str, str], contract: Contract, transport: ContractTransport, key: str
) -> None:
    provider = os.environ["SETTLE_CALLBACK_PROVIDER"]
    answers: list[dict[str, Any]] = []
    callbacks = settle_client.Callbacks(
        server["url"],
        provider,
        os.environ["SETTLE_CALLBACK_SECRET"],
        transport=ContractTransport(contract),
    )
    forged = settle_client.Callbacks(
        server["url"], provider, "not-the-secret", transport=ContractTransport(contract)
    )

    def effect(token: str) -> str:
        with pytest.raises(errors.BadSignature):
            forged.notify(
                operation_key=key,
                status="committed",
                params_digest=settle_client.params_digest(PARAMS),
                reference="cb-ref",
                sequence=1,
            )
        answers.append(
            callbacks.notify(
                operation_key=key,
                status="committed",
                params_digest=settle_client.params_digest(PARAMS),
                reference="cb-ref",
                sequence=1,
            )
        )
        return "cb-ref"

    with make_host(server, transport) as host:
        outcome = host.run(
            key,
            action="payment.send",
            provider=provider,
            params=PARAMS,
            effect=effect,
            on_approval=make_approver(server, contract).approve,
        )
    assert answers == [{"applied": True, "state": "released"}]
    assert outcome.state == "released"


def _customer_approves(server: dict[str, str], link: str) -> None:
    """What the customer's phone does with the link: the page's POSTs, token in the body."""
    token = link.split("#", 1)[1]
    with httpx.Client(base_url=server["url"], timeout=30, trust_env=False) as phone:
        phone.get("/approve/")
        headers = {"X-CSRFToken": phone.cookies["csrftoken"]}
        state = phone.post("/approve/state", data={"token": token}, headers=headers)
        digest = re.search(r'name="params_digest" value="([^"]+)"', state.text)
        assert digest is not None, state.text
        fields = {"token": token, "decision": "approve", "params_digest": digest.group(1)}
        assert phone.post("/approve/decide", data=fields, headers=headers).status_code == 200


def test_a_customer_approves_by_the_link_the_host_reads(
    server: dict[str, str], transport: ContractTransport, key: str
) -> None:
    party = {"id": "cust-8812", "name": "Ada Lovelace"}
    with make_host(server, transport) as host:

        def on_approval(approval_id: str) -> None:
            record = host.approval(approval_id)
            assert record["party"] == {**party, "contact": ""} and record["expires_at"]
            _customer_approves(server, record["link"])

        outcome = host.run(
            key,
            action="customer.pay",
            provider=server["provider"],
            params=PARAMS,
            effect=lambda token: f"pay-{key}",
            on_approval=on_approval,
            party=party,
        )
    assert (outcome.state, outcome.ran_effect) == ("released", True)


def test_an_approval_for_the_customer_without_a_party_is_refused(
    server: dict[str, str], transport: ContractTransport, key: str
) -> None:
    with make_host(server, transport) as host, pytest.raises(errors.PartyRequired):
        host.run(key, action="customer.pay", provider=server["provider"], params=PARAMS, effect=str)


def test_a_host_links_its_customer_to_enrol_and_reads_their_passkeys(
    server: dict[str, str], transport: ContractTransport, key: str
) -> None:
    party = f"cust-{key}"
    with make_host(server, transport) as host:
        link = host.party_enrolment(party, name="Ada Lovelace")
        assert "/enrol/#" in link["url"] and link["party"] == party and link["expires_at"]
        assert host.party(party) == {"party": party, "display_name": "Ada Lovelace", "passkeys": []}
        with pytest.raises(errors.UnknownPasskey):
            host.party_passkey_remove(party, 999_999)
        with pytest.raises(errors.UnknownParty):
            host.party(f"nobody-{key}")
