"""The policy in force, applying a new one, and what it asks of an approval as it opens.

policy in force
    The newest applied ``Policy`` row. Each process keeps the parsed policy and asks
    the database only which version is newest: one short statement per opening.
policy of an approval
    The version in force when it opened (``Approval.policy_version``), read from any row
    that version was applied as (``policy_at``): what it said of the action then, however
    many policies were applied since. Each process keeps the few versions last read.
terms
    What the policy asks of one opening (``approval_terms``): the rule that decided,
    and its outcome, people, passkey and timings. An ``approve`` rule with a budget
    decides only if the budget pays for the opening (``budget_spend``); otherwise the
    next matching rule decides.
budget
    Spent one opening at a time: the spending locks its ``BudgetLock`` row (made on
    first use), then inserts the use only if the uses still in the window leave room,
    in one statement. Concurrent openings against one budget wait for each other, so
    the approved total never passes the limit; unrelated budgets never wait.
paid last
    Every opening paid by one budget waits for that row, and a lock is held until the
    transaction commits: taken as the opening decides, it would be held through the
    rest of it (the approval, the permit, a dispatch, the events), and the openings of
    a busy budget would queue for each other. So an opening that owns its transaction
    (``budgets_paid_last``: the host API's register and open) pays last: the rule is
    taken to pay, the lock is taken by the statement that writes the transaction's
    events (``audit_transaction_rider``) and the use is its last statement, after them
    (``audit_transaction_last``). Where the budget cannot pay then, the
    whole transaction rolls back (``BudgetRaced``) and runs once more paying as it
    decides, so that the next rule decides, as it would have; the same budget is then
    paid first in this process for ``PAID_FIRST_SECONDS``, while it is likely spent.
"""

from __future__ import annotations

import difflib
import functools
import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from django.db import connection
from django.utils import timezone

from audit.chain import (
    audit_append,
    audit_transaction,
    audit_transaction_last,
    audit_transaction_rider,
    audit_transaction_rides,
)
from audit.kinds import AuditKind
from common.actors import Actor
from dbsql import columns
from dbsql.cursor import kept_cursor
from dbsql.writes import Rider, insert_where
from policies.models import BudgetLock, BudgetUse, Policy
from policies.policy_file import PolicyError, policy_parse, version_of
from policies.rules import CUSTOMER_OUTCOMES, NO_POLICY, ONE_PERSON, Budget, Rule
from policies.rules import Policy as ParsedPolicy

__all__ = ["PolicyError", "version_of"]

logger = logging.getLogger(__name__)
_cache_lock = threading.Lock()
_cached: dict[str, ParsedPolicy] = {}
# The one in force, and the older ones that approvals still pending opened under.
CACHED_VERSIONS = 8


def policy_current() -> ParsedPolicy:
    """The policy in force (``NO_POLICY`` before any was applied)."""
    # A kept text, not a queryset: every opening asks it (``dbsql.rows`` says why).
    with kept_cursor() as cursor:
        cursor.execute(_newest_sql())
        newest = cursor.fetchone()
    if newest is None:
        return NO_POLICY
    pk, version = newest
    return _parsed(version, lambda: Policy.objects.values_list("source", flat=True).get(pk=pk))


@functools.cache
def _newest_sql() -> str:
    pk, version = (columns.quote(columns.column(Policy, name)) for name in ("pk", "version"))
    table = columns.quote(Policy._meta.db_table)
    return f"SELECT {pk}, {version} FROM {table} ORDER BY {pk} DESC LIMIT 1"


def policy_parsed(applied: Policy | None) -> ParsedPolicy:
    """The rules of an applied policy row already read (``NO_POLICY`` for None)."""
    if applied is None:
        return NO_POLICY
    return _parsed(applied.version, lambda: applied.source)


def _parsed(version: str, source: Callable[[], str]) -> ParsedPolicy:
    """The parsed policy of ``version``: kept per process, ``source`` read only when not."""
    cached = _cached.get(version)
    if cached is None:
        try:
            cached = policy_parse(source().encode())
        except PolicyError:
            # Applied by an older Settle whose check let it through, and refused by
            # this one (a NaN condition, a duration past a date): no rule may approve
            # by it, so every opening asks one person until a policy is applied again.
            logger.exception("the policy %s no longer reads: one person decides by it", version)
            cached = ParsedPolicy(version=version)
        with _cache_lock:
            while len(_cached) >= CACHED_VERSIONS:
                del _cached[next(iter(_cached))]  # the first read goes first
            _cached[version] = cached
    return cached


def policy_at(version: str) -> ParsedPolicy:
    """The policy as it was applied at ``version`` (``NO_POLICY`` for ""; one statement
    when this process has not read it)."""
    return policies_at({version})[version]


def policies_at(versions: Collection[str]) -> dict[str, ParsedPolicy]:
    """Each of ``versions`` as applied, read in one statement if any is not kept; a
    version no row holds reads as ``NO_POLICY``."""
    found: dict[str, ParsedPolicy] = {version: NO_POLICY for version in versions if not version}
    missing = {version for version in versions if version and version not in _cached}
    sources = dict(
        Policy.objects.filter(version__in=missing).values_list("version", "source")
        if missing
        else ()
    )
    for version in set(versions) - set(found):
        if version in missing and version not in sources:
            found[version] = NO_POLICY  # no row holds it: nothing was applied at it
            continue
        found[version] = _parsed(version, partial(_source, version, sources))
    return found


def _source(version: str, sources: dict[str, str]) -> str:
    """A version's source as read, or read again: it left this process's cache meanwhile."""
    if version in sources:
        return sources[version]
    return Policy.objects.filter(version=version).values_list("source", flat=True).first() or ""


def passkey_required_for(providers: Collection[str]) -> bool:
    """Whether the policy in force has a person sign, with a passkey, every decision on
    any of ``providers``: their four-eyes reconciliations and bulk batches too, not only
    the approvals their operations open."""
    return not policy_current().passkey_providers.isdisjoint(providers)


def policy_source_current() -> str:
    return Policy.objects.order_by("-id").values_list("source", flat=True).first() or ""


def policy_diff(source: bytes) -> str:
    """What applying ``source`` would change, as a unified diff of the files."""
    old = policy_source_current().splitlines(keepends=True)
    new = source.decode("utf-8").splitlines(keepends=True)
    return "".join(difflib.unified_diff(old, new, "policy in force", "new policy"))


@audit_transaction()
def policy_apply(*, source: bytes, actor: Actor) -> tuple[Policy | None, ParsedPolicy]:
    """Put the policy in ``source`` in force (``PolicyError`` if any of it is wrong).

    Applying the version already in force changes nothing (returns None). The audit
    event records the old and the new file whole, so the log says what rule was in
    force when any approval opened.
    """
    parsed = policy_parse(source)
    old = Policy.objects.select_for_update().order_by("-id").first()
    if old is not None and old.version == parsed.version:
        return None, parsed
    policy = Policy.objects.create(
        version=parsed.version,
        source=source.decode("utf-8"),
        applied_at=timezone.now(),
        applied_by=actor,
    )
    audit_append(
        kind=AuditKind.POLICY_APPLIED,
        actor=actor,
        data={
            "old_version": old.version if old is not None else "",
            "old": old.source if old is not None else "",
            "new_version": policy.version,
            "new": policy.source,
            "rules": len(parsed.rules),
        },
    )
    return policy, parsed


@dataclass(frozen=True)
class Terms:
    """What the policy asks of one approval as it opens: the ``outcome`` ("approve",
    "deny" or "people"), the ``rule`` that decided (``ONE_PERSON`` when none did),
    whether a passkey must sign (a staff person's; ``customer_passkey``: the party's),
    and what a budget paid, for the record."""

    outcome: str
    rule: Rule = ONE_PERSON
    version: str = ""
    passkey: bool = False
    budget: dict[str, Any] | None = None
    # Whom besides staff it asks: "" (staff alone), "customer" (the party alone) or
    # "customer_and_staff"; and whether the party's decision must be passkey-signed.
    customer: str = ""
    customer_passkey: bool = False


def approval_terms(
    *,
    provider: str,
    action: str,
    host: str,
    params: Any,
    approval_id: Any,
    policy: ParsedPolicy | None = None,
) -> Terms:
    """What the policy in force asks of this opening; spends a budget if one pays.

    Runs in the opening's transaction, so a budget's spending commits or rolls back
    with the approval it paid for.
    """
    policy = policy_current() if policy is None else policy
    passkey = provider in policy.passkey_providers
    for rule in policy.matching(provider=provider, action=action, host=host, params=params):
        if rule.outcome == "approve":
            paid = None
            if rule.budget is not None:
                paid = budget_spend(
                    rule=rule,
                    provider=provider,
                    action=action,
                    host=host,
                    params=params,
                    approval_id=approval_id,
                )
                if paid is None:
                    continue
            return Terms("approve", rule, policy.version, budget=paid)
        if rule.outcome == "deny":
            return Terms("deny", rule, policy.version)
        if rule.outcome in CUSTOMER_OUTCOMES:
            return Terms(
                "people",
                rule,
                policy.version,
                passkey=rule.outcome == "customer_and_staff" and (passkey or rule.passkey),
                customer=rule.outcome,
                customer_passkey=rule.customer_passkey,
            )
        return Terms("people", rule, policy.version, passkey=passkey or rule.passkey)
    return Terms("people", version=policy.version, passkey=passkey)


T = TypeVar("T")

# Where an opening pays last (this thread's, inside ``budgets_paid_last``) and, per
# budget and scope, until when this process pays it first (monotonic seconds).
_paying = threading.local()
_paid_first_until: dict[tuple[str, str], float] = {}
PAID_FIRST_SECONDS = 5.0
PAID_FIRST_MAX = 1024  # budgets and scopes remembered; past this many, none


class BudgetRaced(Exception):
    """A budget taken to pay an opening could not pay at the transaction's end."""

    def __init__(self, budget: str, scope: str) -> None:
        super().__init__(f"budget {budget} ({scope}) could not pay")
        self.budget, self.scope = budget, scope


def budgets_paid_last(attempt: Callable[[], T]) -> T:
    """Run ``attempt`` (a whole transaction that may open approvals), its budgets paid
    last; where one cannot pay then, run it once more, paying as it decides.

    ``attempt`` must leave nothing behind when its transaction rolls back: what it
    hands back from a first run is thrown away, and whatever it calls again is called
    afresh. Inside a transaction already open (its end is not this one's to retry),
    it runs once, paying as it decides.
    """
    if _in_transaction() or getattr(_paying, "last", False):
        return attempt()
    _paying.last = True
    try:
        return attempt()
    except BudgetRaced as raced:
        if len(_paid_first_until) >= PAID_FIRST_MAX:
            _paid_first_until.clear()
        _paid_first_until[(raced.budget, raced.scope)] = time.monotonic() + PAID_FIRST_SECONDS
    finally:
        _paying.last = False
    return attempt()


def _in_transaction() -> bool:
    """Whether a transaction is open that ``attempt`` would not own: any but a test
    case's own (as ``transaction.atomic(durable=True)`` counts them)."""
    return any(not getattr(block, "_from_testcase", False) for block in connection.atomic_blocks)


def _pays_last(budget: str, scope: str) -> bool:
    if not getattr(_paying, "last", False):
        return False
    return _paid_first_until.get((budget, scope), 0.0) <= time.monotonic()


def budget_scope(budget: Budget, *, provider: str, action: str, host: str) -> str:
    return host if budget.per == "host" else f"{provider}/{action}"


def budget_spend(
    *, rule: Rule, provider: str, action: str, host: str, params: Any, approval_id: Any
) -> dict[str, Any] | None:
    """Spend ``rule``'s budget on this opening, or None when it does not fit."""
    budget = rule.budget
    assert budget is not None
    amount = budget.amount(params)
    if amount is None:
        return None
    scope = budget_scope(budget, provider=provider, action=action, host=host)
    paid = {"budget": rule.name, "scope": scope, "amount": str(amount)}
    if _pays_last(rule.name, scope):
        lock = ("budget lock", rule.name, scope)
        if not audit_transaction_rides(lock):  # one lock a budget, however many openings
            audit_transaction_rider(_budget_lock_sql(rule.name, scope), keys=[lock])

        def last() -> None:
            if not _budget_use(budget, rule.name, scope, amount, approval_id):
                raise BudgetRaced(rule.name, scope)

        audit_transaction_last(last)
        return paid
    return paid if _budget_pay(budget, rule.name, scope, amount, approval_id) else None


def _budget_pay(budget: Budget, name: str, scope: str, amount: Any, approval_id: Any) -> bool:
    """Lock the budget and insert the use if the window leaves room: whether it did."""
    with kept_cursor() as cursor:
        cursor.execute(*_budget_lock_sql(name, scope))
    return _budget_use(budget, name, scope, amount, approval_id)


def _budget_use(budget: Budget, name: str, scope: str, amount: Any, approval_id: Any) -> bool:
    """Insert the use if the window leaves room, the budget locked: whether it did."""
    # Read the clock only now, with the budget locked: the window is the one this
    # spending sees, however long the lock took.
    now = timezone.now()
    checks: list[str] = []
    values: list[Any] = []
    if budget.count is not None:
        checks.append("u.n + 1 <= %s")
        values.append(budget.count)
    if budget.limit is not None:
        checks.append("u.total + CAST(%s AS NUMERIC) <= CAST(%s AS NUMERIC)")
        values += [amount, budget.limit]
    condition = (
        f"(SELECT {' AND '.join(checks)} FROM (SELECT COUNT(*) AS n, "
        f"COALESCE(SUM(amount), 0) AS total FROM {BudgetUse._meta.db_table} "
        "WHERE budget = %s AND scope = %s AND at > %s) u)"
    )
    use = BudgetUse(budget=name, scope=scope, approval_id=approval_id, amount=amount, at=now)
    return insert_where(use, condition, [*values, name, scope, now - budget.window])


def _budget_lock_sql(budget: str, scope: str) -> Rider:
    """The statement that locks the budget's row for its transaction, made on first use."""
    table = BudgetLock._meta.db_table
    return (
        f"INSERT INTO {table} (budget, scope) VALUES (%s, %s) "
        "ON CONFLICT (budget, scope) DO UPDATE SET budget = EXCLUDED.budget",
        [budget, scope],
    )
