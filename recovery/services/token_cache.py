"""Bearer tokens resolved to their credential once, then kept for a bounded time.

Each host-API call starts by finding the credential its token names (one statement). A
web process keeps a credential it found for at most ``SETTLE_CREDENTIAL_CACHE_SECONDS``,
so disabling or rotating a credential, or changing an approver's scope, takes effect on
every process within that bound (0: from the next request, with no cache). The process
that disables or rotates one forgets it at once. Only credentials found are kept: a
token refused is looked up again each time, so a credential enabled again or created
works at once, and a flood of wrong tokens fills nothing.
"""

from __future__ import annotations

import time

from django.conf import settings

from approvals.models import Approver
from approvals.services.approvers import credential_by_hash
from common.credentials import token_hash, token_kind
from recovery.models import Host

# A process serves few credentials; past this many, it starts again from none.
MAX_ENTRIES = 1024

_found: dict[str, tuple[float, Host | Approver]] = {}


def credential_authenticate(*, token: str) -> Host | Approver | None:
    """The active host or approver holding ``token``, as found at most the bound ago."""
    bound = settings.SETTLE_CREDENTIAL_CACHE_SECONDS
    hashed = token_hash(token)
    now = time.monotonic()
    if bound > 0:
        held = _found.get(hashed)
        if held is not None and now < held[0]:
            return held[1]
    # Each kind of token carries its prefix, so one lookup finds its owner.
    model: type[Host] | type[Approver] = Approver if token_kind(token) == "approver" else Host
    credential = credential_by_hash(model, hashed)
    if credential is None or bound <= 0:
        _found.pop(hashed, None)
        return credential
    if len(_found) >= MAX_ENTRIES:
        _found.clear()
    _found[hashed] = (now + bound, credential)
    return credential


def credential_forget(*, token_hash: str) -> None:
    """Drop what this process holds for the token hashed as ``token_hash``."""
    _found.pop(token_hash, None)
