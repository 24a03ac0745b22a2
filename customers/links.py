"""The approval link a customer follows: its token, the approval it names, its URL.

Built in the bottom layer (``common.links``), where the host API and the webhooks that
hand the link out can reach it; the customer pages read tokens through this module.
"""

from __future__ import annotations

from common.links import approval_for_token, approval_link_token, approval_link_url

__all__ = ["approval_for_token", "approval_link_token", "approval_link_url"]
