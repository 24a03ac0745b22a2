"""Customer approvals for tests: a policy that asks the customer, an opening naming a
party, and the approval link's page driven as its script drives it."""

from __future__ import annotations

from typing import Any

from django.test import Client

from common.actors import Actor
from common.links import approval_link_token
from policies.services import policy_apply
from tests.support.flow import PARAMS, Flow

CUSTOMER_POLICY = b"""
[[rules]]
name = "signed-by-customer"
when = ["/amount >= 5000"]
outcome = "customer"
customer_passkey = true

[[rules]]
name = "customer-and-staff"
when = ['/currency == "GBP"']
outcome = "customer_and_staff"
expires_after = "2h"

[[rules]]
name = "customer"
outcome = "customer"
expires_after = "1h"
permit_ttl = "10m"

[[actions]]
action = "payment.send"
summary = "Pay {/amount:money:/currency} to {/to}"
"""
PARTY = {"id": "cust_8812", "name": "Ada Lovelace"}


def customer_policy_apply() -> None:
    policy_apply(source=CUSTOMER_POLICY, actor=Actor.system("test"))


def customer_open(
    flow: Flow,
    key: str = "op-1",
    params: dict[str, Any] | None = None,
    party: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Register ``key`` and open its approval naming ``party``: the API's answer."""
    flow.register(key, params if params is not None else PARAMS)
    response = flow.host_api.post(
        f"/api/v1/operations/{key}/approvals", {"party": party if party is not None else PARTY}
    )
    assert response.status_code == 201, response.content
    return response.json()


class Page:
    """The approval link's page as its script uses it: the token in POST bodies, with
    the CSRF token the page gave."""

    def __init__(self, approval_id: str, client: Client | None = None, **headers: str) -> None:
        self.client = client or Client(enforce_csrf_checks=True)
        self.token = approval_link_token(approval_id)
        self.headers = headers
        self.opened = self.client.get("/approve/", **headers)
        self.csrf = self.opened.cookies["csrftoken"].value

    def post(self, path: str, **fields: str) -> Any:
        return self.client.post(
            path,
            {"token": self.token, **fields},
            HTTP_X_CSRFTOKEN=self.csrf,
            **self.headers,
        )

    def state(self) -> Any:
        return self.post("/approve/state")

    def decide(self, decision: str, digest: str, reason: str = "") -> Any:
        return self.post("/approve/decide", decision=decision, params_digest=digest, reason=reason)
