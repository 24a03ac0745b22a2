"""An approval link's token: it names one approval and proves Settle gave it."""

from __future__ import annotations

import base64
import uuid

from common.links import TOKEN_LENGTH
from customers.links import approval_for_token, approval_link_token, approval_link_url


def test_a_token_reads_back_as_its_approval_and_is_stable():
    approval_id = uuid.uuid4()
    token = approval_link_token(approval_id)
    assert len(token) == TOKEN_LENGTH and token == approval_link_token(str(approval_id))
    assert approval_for_token(token) == approval_id


def test_a_token_carries_128_bits_that_only_the_secret_makes():
    approval_id = uuid.uuid4()
    raw = base64.urlsafe_b64decode(approval_link_token(approval_id) + "=")
    assert raw[:16] == approval_id.bytes and len(raw[16:]) == 16
    forged = base64.urlsafe_b64encode(approval_id.bytes + bytes(16)).rstrip(b"=").decode()
    assert approval_for_token(forged) is None


def test_a_token_of_one_approval_does_not_open_another():
    one, other = uuid.uuid4(), uuid.uuid4()
    raw = base64.urlsafe_b64decode(approval_link_token(one) + "=")
    swapped = base64.urlsafe_b64encode(other.bytes + raw[16:]).rstrip(b"=").decode()
    assert approval_for_token(swapped) is None


def test_a_token_made_under_another_secret_is_refused(settings):
    approval_id = uuid.uuid4()
    token = approval_link_token(approval_id)
    settings.SECRET_KEY = "another secret, long enough to be a real one, 0123456789"
    assert approval_for_token(token) is None


def test_anything_else_is_no_token():
    for text in ["", "x" * TOKEN_LENGTH, "é" * TOKEN_LENGTH, "!" * TOKEN_LENGTH, None, 5]:
        assert approval_for_token(text) is None  # type: ignore[arg-type]


def test_the_url_carries_the_token_in_its_fragment(settings):
    settings.SETTLE_CUSTOMER_URL = "https://approve.example.com"
    approval_id = uuid.uuid4()
    url = approval_link_url(approval_id)
    assert url == f"https://approve.example.com/approve/#{approval_link_token(approval_id)}"
