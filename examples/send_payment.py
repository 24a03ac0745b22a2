"""An agent's "send payment" tool, made crash-safe with settle_client.

The function ``send_payment`` is what an LLM agent framework would call as a tool. The
payment provider here is a journal file (one checksummed JSON line per payment, the
provider's own record, which Settle's journal adapter reads). Run it against ``make run``:

    .venv/bin/python manage.py add_provider example-payments --adapter journal \\
        --path /tmp/example-payments.jsonl --missing-ok --lease-seconds 5
    export SETTLE_HOST_TOKEN=$(.venv/bin/python manage.py create_host example-agent)
    export SETTLE_APPROVER_TOKEN=$(.venv/bin/python manage.py create_approver \\
        example-phone --provider example-payments)

    python examples/send_payment.py --invoice 42 --crash-after-payment   # SIGKILLed
    python examples/send_payment.py --invoice 42     # released (recovered), no 2nd payment

With ``SETTLE_APPROVER_TOKEN`` set, the example approves as the customer's phone would
(reading the exact action first); without it, approve in the console or the API.
Needs only ``pip install ./clients/python``.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import signal
from datetime import UTC, datetime
from typing import Any

import settle_client

SETTLE_URL = os.environ.get("SETTLE_URL", "http://127.0.0.1:8000")
JOURNAL = os.environ.get("PAYMENTS_JOURNAL", "/tmp/example-payments.jsonl")
PROVIDER = os.environ.get("PAYMENTS_PROVIDER", "example-payments")


def payments_transfer(key: str, params: dict[str, Any]) -> str:
    """The payment provider's API: appends its own checksummed record, fsynced."""
    reference = f"tx-{key}"
    with open(JOURNAL, "a+b") as journal:
        fcntl.flock(journal.fileno(), fcntl.LOCK_EX)
        journal.seek(0)
        record: dict[str, Any] = {
            "seq": sum(1 for _ in journal) + 1,
            "operation_key": key,
            "params_digest": settle_client.params_digest(params),
            "reference": reference,
            "status": "committed",
            "committed_at": datetime.now(UTC).isoformat(),
        }
        canonical = settle_client.canonical_params(record)
        record["checksum"] = "sha256:" + hashlib.sha256(canonical).hexdigest()
        journal.write(settle_client.canonical_params(record) + b"\n")
        journal.flush()
        os.fsync(journal.fileno())
    return reference


def send_payment(invoice: str, amount: int, currency: str, to: str, crash: bool = False) -> str:
    """Pay an invoice once, however often the agent (or its restart) calls this tool."""
    key = f"invoice-{invoice}"  # the agent's intent, never derived from the amount
    params = {"amount": amount, "currency": currency, "to": to}
    approver_token = os.environ.get("SETTLE_APPROVER_TOKEN", "")

    def approve(approval_id: str) -> None:
        if not approver_token:
            print(f"waiting for a person to approve {approval_id} …")
            return
        with settle_client.Approver(SETTLE_URL, approver_token) as phone:
            approval = phone.approval(approval_id)
            print(f"phone shows: {approval.action} {approval.params}")
            phone.decide(approval, approve=True)

    def effect(fencing_token: str) -> str:
        reference = payments_transfer(key, params)
        print(f"paid: {reference}")
        if crash:
            os.kill(os.getpid(), signal.SIGKILL)  # the machine dies before the report
        return reference

    with settle_client.Host(SETTLE_URL, os.environ["SETTLE_HOST_TOKEN"]) as host:
        try:
            outcome = host.run(
                key,
                action="payment.send",
                provider=PROVIDER,
                params=params,
                effect=effect,
                on_approval=approve,
            )
        except settle_client.NeedsOperator as exc:
            return f"{key}: an operator must decide ({exc.state}, {exc.reason})"
        except settle_client.SettleError as exc:
            return f"{key}: not paid ({exc.code}: {exc})"
    how = "recovered from the provider's record" if outcome.recovered else "reported"
    return f"{key}: {outcome.state} ({how}; ran the payment now: {outcome.ran_effect})"


def payments_for(key: str) -> int:
    if not os.path.exists(JOURNAL):
        return 0
    with open(JOURNAL, encoding="utf-8") as journal:
        return sum(1 for line in journal if json.loads(line)["operation_key"] == key)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="send one payment, crash-safely")
    parser.add_argument("--invoice", required=True)
    parser.add_argument("--amount", type=int, default=1250)
    parser.add_argument("--currency", default="EUR")
    parser.add_argument("--to", default="acct-7")
    parser.add_argument("--crash-after-payment", action="store_true")
    args = parser.parse_args()
    print(send_payment(args.invoice, args.amount, args.currency, args.to, args.crash_after_payment))
    print(
        f"payments the provider holds for invoice-{args.invoice}: "
        f"{payments_for(f'invoice-{args.invoice}')}"
    )
