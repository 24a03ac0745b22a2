"""The host API's contract for a host's customers (parties) and their passkeys: the
bodies of ``recovery.api_parties``, beside ``recovery.contract``'s and built the same way."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from recovery.contract import Body, Timestamp
from recovery.contract_fields import NoNul


class EnrolmentRequest(Body):
    name: Annotated[str, StringConstraints(max_length=200), NoNul] = Field(
        default="", description="The party's display name (replaces the kept one if given)."
    )
    contact: Annotated[str, StringConstraints(max_length=500), NoNul] = Field(
        default="", description="Where Settle may send the party their approval links."
    )


class EnrolmentLink(Body):
    url: str = Field(
        description="The one-time enrolment page, the token in its fragment: deliver it "
        "inside your signed-in app (it vouches for the person)."
    )
    expires_at: Timestamp
    party: str


class PartyPasskeyRecord(Body):
    id: int
    name: str
    created_at: Timestamp
    removed_at: Timestamp | None = Field(description="null while it may sign")


class PartyPasskeys(Body):
    """A host's customer and the passkeys enrolled for them, removed ones included."""

    party: str
    display_name: str
    passkeys: list[PartyPasskeyRecord]


class PasskeyRemoved(Body):
    passkey: PartyPasskeyRecord
    removed: bool = Field(description="false: it was removed already (nothing recorded)")
