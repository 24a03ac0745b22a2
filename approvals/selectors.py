"""Reads of approvals and permits, and who a policy lets decide an approval.

standing
    The policy's rules on whose decision counts, once, as SQL the inbox filters on and
    the deciding service reads for one approval to name its refusal
    (``approvals_with_standing``): never the proposer's own action, and, where the
    policy named groups, only a member of one of them (the user's Django groups, which
    sign-on mirrors from the directory).

proposer
    A person, not a text. The host names them by username, case-insensitively; the user
    it names when the approval opens is kept by id (``Approval.proposer_user``), so a
    rename later changes nothing, and so is any account with that user's e-mail address
    (compared case-insensitively, as votes are). A name that resolves to nobody (or to
    more than one user) is kept as text: whoever holds that username, in any case, when
    deciding is the proposer.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import BooleanField, ExpressionWrapper, Func, Q, QuerySet, Subquery

from approvals.models import Approval, ApprovalVote, Permit, PermitEvent
from common.actors import Actor
from dbsql.clock import DatabaseNow


class _ListHoldsAny(Func):
    """Whether a JSON list of strings holds any value of a one-column subquery.

    Each database spells "the elements of a JSON array" its own way, and Django has no
    lookup for it on SQLite.
    """

    arity = 2
    output_field = BooleanField()

    def _exists(self, compiler: Any, elements: str) -> tuple[str, tuple[Any, ...]]:
        listed, values = self.get_source_expressions()
        listed_sql, listed_params = compiler.compile(listed)
        values_sql, values_params = compiler.compile(values)
        sql = f"EXISTS (SELECT 1 FROM {elements % listed_sql} WHERE g.value IN {values_sql})"
        return sql, (*listed_params, *values_params)

    def as_sqlite(
        self, compiler: Any, connection: Any, **extra: Any
    ) -> tuple[str, tuple[Any, ...]]:
        return self._exists(compiler, "json_each(%s) AS g")

    def as_postgresql(
        self, compiler: Any, connection: Any, **extra: Any
    ) -> tuple[str, tuple[Any, ...]]:
        return self._exists(compiler, "jsonb_array_elements_text(%s) AS g(value)")


def decidable_now() -> Q:
    """Pending, and not past its ``expires_at`` by the database's clock: what a person
    may still decide. The sweep closes the rest when it comes by; until then they are
    not offered, as a decision on them would be refused (``approval_expired``)."""
    return Q(status=Approval.Status.PENDING) & (
        Q(expires_at__isnull=True) | Q(expires_at__gt=DatabaseNow())
    )


def proposer_user_for(*, name: str) -> Any | None:
    """The user a host's ``proposer`` names: the one whose username it is, compared
    case-insensitively (``Ann`` names ``ann``); None when it names nobody, or more than
    one user (then the name itself is compared at each decision: see ``standing``)."""
    if not name:
        return None
    model = get_user_model()
    found = list(model._default_manager.filter(**{f"{model.USERNAME_FIELD}__iexact": name})[:2])
    return found[0] if len(found) == 1 else None


def _by_proposer(user: Any) -> Q:
    """Whether ``user`` is the approval's proposer (see ``standing``)."""
    # Each term is false, never NULL, where no user was kept: the inbox filters on
    # ``by_proposer=False``, which a NULL would fail.
    kept = Q(proposer_user__isnull=False)
    named = Q(proposer_user__isnull=True) & ~Q(proposer="")
    mine = (kept & Q(proposer_user=user.pk)) | (named & Q(proposer__iexact=user.get_username()))
    email = getattr(user, user.get_email_field_name(), "")
    if email:
        # Another account of the same person (a break-glass one, say) is them too.
        mine |= kept & Q(**{f"proposer_user__{user.get_email_field_name()}__iexact": email})
    return mine


def approvals_with_standing(*, user: Any) -> QuerySet[Approval]:
    """Approvals, each with ``user``'s standing under its policy (see ``standing``):
    ``by_proposer`` (the action is the user's own proposal) and ``in_groups`` (the
    policy named no groups, or the user is in one of them)."""
    groups = Subquery(user.groups.values("name"))
    return Approval.objects.annotate(
        by_proposer=ExpressionWrapper(_by_proposer(user), output_field=BooleanField()),
        in_groups=ExpressionWrapper(
            Q(groups=[]) | Q(_ListHoldsAny("groups", groups)), output_field=BooleanField()
        ),
    )


def approval_needed(*, approval: Approval, approvals: int) -> str:
    """What a pending approval still needs, as hosts and people read it ("1 of 2 approvals")."""
    if approval.status != Approval.Status.PENDING:
        return ""
    if approval.customer == Approval.Customer.CUSTOMER:
        return "the customer's decision"
    if approval.customer == Approval.Customer.CUSTOMER_AND_STAFF:
        return f"{approvals} of 2 approvals: the customer's and one staff person's"
    return f"{approvals} of {approval.required} approvals"


def approval_votes(*, approval: Approval) -> list[ApprovalVote]:
    """The people who decided so far, in the order they did."""
    return list(approval.votes.order_by("at", "id"))


def permit_history(
    permit: Permit, *, events: Iterable[PermitEvent] | None = None, row: bool = True
) -> list[dict[str, Any]]:
    """Every line of a permit's history, oldest first.

    Issue, consumption and revocation are read from the permit's row (unless ``row`` is
    False: a later page of the history); refusals, ignored revocations and expiry from
    its events (``events``: a page of them; else ``permit.events``, maybe prefetched).
    """
    lines: list[tuple[datetime, int, dict[str, Any]]] = []

    def line(
        kind: str, at: datetime, actor: Actor | None, detail: dict[str, Any], order: int
    ) -> None:
        lines.append(
            (at, order, {"kind": kind, "reason": "", "actor": actor, "at": at, "detail": detail})
        )

    if row:
        line(
            PermitEvent.Kind.ISSUED,
            permit.issued_at,
            permit.approval.decided_by,
            {"ttl_seconds": round((permit.expires_at - permit.issued_at).total_seconds())},
            0,
        )
        if permit.consumed_at is not None:
            line(
                PermitEvent.Kind.CONSUMED,
                permit.consumed_at,
                permit.consumed_by,
                {"presented_digest": permit.params_digest},
                1,
            )
        if permit.revoked_at is not None:
            line(
                PermitEvent.Kind.REVOKED,
                permit.revoked_at,
                permit.revoked_by,
                {"reason": permit.revoke_reason, "status": Permit.Status.REVOKED},
                1,
            )
    for event in permit.events.all() if events is None else events:
        lines.append(
            (
                event.at,
                2,
                {
                    "id": event.pk,
                    "kind": event.kind,
                    "reason": event.reason,
                    "actor": event.actor,
                    "at": event.at,
                    "detail": event.detail,
                },
            )
        )
    lines.sort(key=lambda item: (item[0], item[1]))
    return [entry for _, _, entry in lines]
