"""Who did something: one identity type for every audit line and every "who" check.

An ``Actor`` names a credential by kind and primary key, so two actors are the same
when they are the same credential — a renamed user is still themselves, and two users
who share a display name are not (four eyes compares actors, never names). The name is
kept as it was at the time, for reading.

Kinds: ``host`` and ``approver`` (API tokens), ``user`` (a console or admin session),
``provider`` (a signed callback), ``party`` (a host's customer, deciding through an
approval link: its id is the ``Party`` row's, its name ``host/party``), ``system``
(Settle itself: a command, the sweeper; its id names the component).

It lives in the bottom layer so that every app can name who acted. Stored in one column
as ``kind:id:name`` (``ActorField``); rows written before ids were kept read back as
``kind:name`` with an empty id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import models


@dataclass(frozen=True)
class Actor:
    kind: str
    id: str
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if ":" in self.id:
            raise ValueError("an actor id cannot contain ':'")

    @classmethod
    def of(cls, kind: str, credential: Any) -> Actor:
        """The actor of a saved credential row (a host, approver, user or provider)."""
        assert kind in ("host", "approver", "user", "provider"), kind
        if kind == "user":
            return cls("user", str(credential.pk), credential.get_username())
        return cls(kind, str(credential.pk), credential.name)

    @classmethod
    def party(cls, party: Any) -> Actor:
        """The actor of a saved ``approvals.models.Party``: the customer it names."""
        return cls("party", str(party.pk), f"{party.host}/{party.party}")

    @classmethod
    def system(cls, component: str) -> Actor:
        return cls("system", component, component)

    @property
    def stored(self) -> str:
        """The column's text; ``parse`` reads it back exactly (the audit hash covers it)."""
        if self.id:
            return f"{self.kind}:{self.id}:{self.name}"
        return f"{self.kind}:{self.name}" if self.name else self.kind

    @property
    def identity(self) -> str:
        """Who it is, whatever its name: ``kind:id`` (a person votes once by this).

        An actor written before ids were kept has only its name to go by.
        """
        return f"{self.kind}:{self.id}" if self.id else self.stored

    @classmethod
    def parse(cls, stored: str) -> Actor:
        kind, _, rest = stored.partition(":")
        ident, sep, name = rest.partition(":")
        if not sep:  # written before ids were kept: "kind:name"
            ident, name = "", rest
        return cls(kind, ident, name)

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"


# Whoever runs a management command (the shell's user is not a Settle identity).
COMMAND_LINE = Actor.system("manage.py")

if TYPE_CHECKING:
    _CharField = models.CharField[Actor | None, Actor | None]
else:
    _CharField = models.CharField


class ActorField(_CharField):
    """A column holding one ``Actor`` (or none: the empty string)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", 200)
        kwargs.setdefault("blank", True)
        super().__init__(*args, **kwargs)

    def from_db_value(self, value: str | None, expression: Any, connection: Any) -> Actor | None:
        return Actor.parse(value) if value else None

    def to_python(self, value: Any) -> Actor | None:
        if value is None or isinstance(value, Actor):
            return value
        return Actor.parse(value) if value else None

    def get_prep_value(self, value: Any) -> str:
        if value is None or value == "":
            return ""
        if not isinstance(value, Actor):
            raise TypeError(f"an ActorField holds an Actor, not {type(value).__name__}")
        return value.stored

    def value_to_string(self, obj: Any) -> str:
        return self.get_prep_value(self.value_from_object(obj))
