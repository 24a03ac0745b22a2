"""Approvals, single-use permits and their history, and the messages owed to approvers.

This app knows nothing of recovery: an approval and its permit bind to an operation by
value (operation key, action, provider name, params digest), never by foreign key.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from common.actors import ActorField


class Approver(models.Model):
    """A credential that may decide approvals over the API (the customer's phone, a desk).

    Its scope: the providers it may decide for (or ``all_providers``), and, when
    ``hosts`` is not empty, only for those hosts' operations. Outside its scope an
    approval or permit does not exist for it.
    """

    name = models.CharField(max_length=100, unique=True)
    token_hash = models.CharField(max_length=71, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Disabled rather than deleted: decisions and history name the approver.
    disabled_at = models.DateTimeField(null=True, blank=True)
    all_providers = models.BooleanField(default=False)
    providers = models.JSONField(default=list, blank=True, help_text="Provider names.")
    hosts = models.JSONField(
        default=list, blank=True, help_text="Host names; empty: any host's operations."
    )

    def __str__(self) -> str:
        return self.name

    @property
    def active(self) -> bool:
        return self.disabled_at is None

    def scope(self, *, provider: str, host: str) -> Q:
        """Its scope as a filter, given the lookups that name a row's provider and host."""
        within = Q()
        if not self.all_providers:
            within &= Q(**{f"{provider}__in": self.providers})
        if self.hosts:
            within &= Q(**{f"{host}__in": self.hosts})
        return within


class Party(models.Model):
    """The person on whose behalf a host acts (its customer), named by the host's own id.

    One row per (host, party): the host names the person again on each opening and the
    row takes the latest display name and contact. Its data is the host's and staff's who
    may view the provider; the party is never a console user. ``host`` is the host's
    name, as ``Approval.host`` holds it (approvals knows nothing of recovery's rows).
    """

    host = models.CharField(max_length=100)
    party = models.CharField(max_length=100, help_text="The host's own stable id for the person.")
    display_name = models.CharField(max_length=200, blank=True)
    # Where Settle may send the person their approval links (an Apprise URL of a scheme
    # and server the operator's settings allow), or empty: the host delivers them.
    contact = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["host", "party"], name="party_one_per_host"),
        ]
        verbose_name_plural = "parties"

    def __str__(self) -> str:
        return f"{self.host}/{self.party}"


class Approval(models.Model):
    class Customer(models.TextChoices):
        NONE = "", "no customer"
        CUSTOMER = "customer"
        CUSTOMER_AND_STAFF = "customer_and_staff"

    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        DENIED = "denied"
        EXPIRED = "expired"
        CANCELLED = "cancelled"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    operation_key = models.CharField(max_length=200, db_index=True)
    action = models.CharField(max_length=200)
    provider = models.CharField(max_length=100)
    host = models.CharField(max_length=100, blank=True, help_text="The requesting host's name.")
    params_digest = models.CharField(max_length=71)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    requested_by = ActorField(blank=False)
    decided_by = ActorField()
    created_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    # What the policy asked for when the approval opened (``policies``). No rule: one
    # person, as before policies existed.
    rule = models.CharField(max_length=100, blank=True, help_text="The policy rule that applied.")
    rule_reason = models.CharField(max_length=500, blank=True)
    policy_version = models.CharField(max_length=71, blank=True)
    required = models.PositiveSmallIntegerField(
        default=1, help_text="Distinct people whose approval it needs."
    )
    groups = models.JSONField(
        default=list, blank=True, help_text="Directory groups its deciders come from; empty: any."
    )
    passkey_required = models.BooleanField(default=False)
    # Decided by counting votes (``ApprovalVote``): set when it needs more than one
    # person, people from named groups, a passkey, or excludes a proposer. Otherwise one
    # decision decides it in one statement, as before policies.
    voting = models.BooleanField(default=False)
    decision_reason = models.CharField(max_length=500, blank=True)
    # The customer the approval is addressed to (``Party``), and what the policy asks of
    # them: nothing (""), their decision alone ("customer"), or theirs and one staff
    # person's ("customer_and_staff"; both approve, either declines); and whether their
    # decision must be signed with a passkey enrolled through the host's app.
    party = models.ForeignKey(
        Party, on_delete=models.PROTECT, null=True, blank=True, related_name="approvals"
    )
    customer = models.CharField(max_length=20, choices=Customer.choices, blank=True)
    customer_passkey = models.BooleanField(default=False)
    # The person on whose behalf the host asked, as the host named them; they never
    # count. ``proposer_user``: the user that name resolved to when it opened (a username,
    # case-insensitive), kept by id so that a rename changes nothing; none when it named
    # nobody Settle knew, and then whoever holds that username when deciding is left out.
    proposer = models.CharField(max_length=150, blank=True)
    proposer_user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    # A person's decision is due by then; the sweep expires it.
    expires_at = models.DateTimeField(null=True, blank=True)
    # Reaching people: who is told, who is told next, and when each message went.
    notify_groups = models.JSONField(default=list, blank=True)
    escalate_groups = models.JSONField(default=list, blank=True)
    remind_at = models.DateTimeField(null=True, blank=True)
    escalate_at = models.DateTimeField(null=True, blank=True)
    notified_at = models.DateTimeField(null=True, blank=True)
    reminded_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["operation_key"],
                condition=Q(status="pending"),
                name="approval_one_pending_per_operation",
            ),
            models.CheckConstraint(condition=Q(required__gte=1), name="approval_required_positive"),
        ]
        indexes = [
            models.Index(
                fields=["created_at", "id"],
                condition=Q(status="pending"),
                name="approval_pending",
            ),
        ]

    def __str__(self) -> str:
        return f"approval {self.id} ({self.status})"


class PartyPasskey(models.Model):
    """A passkey a party enrolled through their host's enrolment link; it signs their
    decisions. Removed rather than deleted: the audit log names it, and verifies the
    decisions it signed while it was enrolled from its own ``party_passkey_added`` and
    ``party_passkey_removed`` events."""

    party = models.ForeignKey(Party, on_delete=models.PROTECT, related_name="passkeys")
    credential_id = models.CharField(max_length=400, unique=True, help_text="base64url")
    public_key = models.TextField(help_text="COSE key, base64url.")
    sign_count = models.PositiveBigIntegerField(default=0)
    name = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    removed_at = models.DateTimeField(null=True, blank=True)
    removed_by = ActorField()

    def __str__(self) -> str:
        return f"passkey {self.credential_id[:12]}… of {self.party}"


class PartyEnrolment(models.Model):
    """A one-time link on which a party enrols a passkey; the host asked for it and
    delivers it inside its signed-in app, which is how it vouches for the person. Only
    the token's hash is kept (``common.credentials.token_hash``)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    party = models.ForeignKey(Party, on_delete=models.PROTECT, related_name="enrolments")
    token_hash = models.CharField(max_length=71, unique=True)
    requested_by = ActorField(blank=False)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"enrolment {self.id} of {self.party}"


class ApprovalVote(models.Model):
    """One person's decision on an approval; a quorum counts distinct voters.

    A person decides an approval once (the same person twice counts once, however
    renamed in between: unique on the voter's identity, not its name). A signed
    vote keeps the WebAuthn assertion over the statement it signed
    (``common.webauthn``), so the decision can be verified without trusting the row.
    """

    approval = models.ForeignKey(Approval, on_delete=models.PROTECT, related_name="votes")
    voter = ActorField(blank=False)
    # ``voter.identity`` (kind and id): one vote per person whatever their name becomes.
    voter_identity = models.CharField(max_length=200)
    approve = models.BooleanField()
    reason = models.CharField(max_length=500, blank=True)
    params_digest = models.CharField(max_length=71)
    at = models.DateTimeField()
    # The signed statement and the assertion over it, or empty when not signed.
    signature = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["approval", "voter_identity"], name="approval_vote_once_per_person"
            ),
        ]

    def __str__(self) -> str:
        return f"{'approve' if self.approve else 'deny'} by {self.voter}"


class Permit(models.Model):
    """The single-use right to dispatch one exact action, issued by one approval.

    Its own row records its lifecycle (issued, consumed, revoked: when and by whom);
    ``PermitEvent`` records what the row cannot hold: every refusal, ignored
    revocations, expiry. ``approvals.selectors.permit_history`` merges the two.
    """

    class Status(models.TextChoices):
        ACTIVE = "active"
        CONSUMED = "consumed"
        EXPIRED = "expired"
        REVOKED = "revoked"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    approval = models.OneToOneField(Approval, on_delete=models.PROTECT, related_name="permit")
    operation_key = models.CharField(max_length=200, db_index=True)
    action = models.CharField(max_length=200)
    provider = models.CharField(max_length=100)
    params_digest = models.CharField(max_length=71)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    issued_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    consumed_at = models.DateTimeField(null=True, blank=True)
    consumed_by = ActorField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = ActorField()
    revoke_reason = models.CharField(max_length=500, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(expires_at__gt=models.F("issued_at")),
                name="permit_expires_after_issue",
            ),
            models.CheckConstraint(
                condition=~Q(status="consumed") | Q(consumed_at__isnull=False),
                name="permit_consumed_has_time",
            ),
        ]

    def __str__(self) -> str:
        return f"permit {self.id} ({self.status})"


class PermitEvent(models.Model):
    """One line of a permit's history that its row cannot hold: a refusal, an expiry…

    ``issued``, ``consumed`` and ``revoked`` lines were written here before the permit
    row recorded them itself; they remain valid kinds for history read back.
    """

    class Kind(models.TextChoices):
        ISSUED = "issued"
        CONSUMED = "consumed"
        REFUSED = "refused"
        REVOKED = "revoked"
        REVOKE_IGNORED = "revoke_ignored"
        EXPIRED = "expired"

    permit = models.ForeignKey(Permit, on_delete=models.PROTECT, related_name="events")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    reason = models.CharField(max_length=32, blank=True)
    actor = ActorField()
    detail = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField()

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["permit", "at"], name="permit_event_permit_at")]

    def __str__(self) -> str:
        return f"{self.kind} {self.reason}".strip()


class ReconciliationRequest(models.Model):
    """A proposed operator decision that a second person must approve (four eyes).

    Made when the evidence does not back the decision by itself: a confirm or a void
    without matching evidence, a receipt repaired without it. Binds to the operation by
    value, as approvals do, and to what the proposer saw: the operation's version and
    its latest evidence. If either has moved on when a second person decides, the
    request is ``invalidated`` and nothing changes. The proposer never decides their
    own request.
    """

    class Action(models.TextChoices):
        CONFIRM = "confirm"
        VOID = "void"
        REPAIR = "repair"

    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        REJECTED = "rejected"
        INVALIDATED = "invalidated"

    operation_key = models.CharField(max_length=200, db_index=True)
    provider = models.CharField(max_length=100)
    params_digest = models.CharField(max_length=71)
    action = models.CharField(max_length=10, choices=Action.choices)
    operation_version = models.PositiveIntegerField()
    # The latest evidence the proposer saw (an id of recovery's evidence), or None.
    evidence_seen = models.BigIntegerField(null=True, blank=True)
    reason = models.CharField(max_length=500)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.PENDING)
    proposed_by = ActorField(blank=False)
    proposed_at = models.DateTimeField()
    decided_by = ActorField()
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.CharField(max_length=500, blank=True)
    # The decider's passkey signature of the decision (``common.webauthn``'s record),
    # also in its audit event; empty when it was not signed.
    signature = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["operation_key"],
                condition=Q(status="pending"),
                name="reconciliation_one_pending_per_operation",
            ),
            models.CheckConstraint(
                condition=Q(status="pending") | Q(decided_at__isnull=False),
                name="reconciliation_decided_has_time",
            ),
        ]
        indexes = [
            models.Index(
                fields=["proposed_at", "id"],
                condition=Q(status="pending"),
                name="reconciliation_pending",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.action} of {self.operation_key} ({self.status})"


class ApprovalNotice(models.Model):
    """One message owed to one channel tag about one approval (``approvals.notices``).

    Written when a run claims the approval (opened, reminder, escalation), or with the
    approval's expiry, in its transaction (expired); sent by a run, grouped with every
    other notice due for the same tag, after the commit. ``claimed_until``: a run is
    sending it until then (one that died leaves it to the next run after). A send that
    failed keeps its error and is tried again by the next run; one that can no longer
    matter (its approval decided before the opening went out, or a day old) is dropped.
    """

    class Kind(models.TextChoices):
        OPENED = "opened"
        REMINDER = "reminder"
        ESCALATION = "escalation"
        EXPIRED = "expired"

    class Status(models.TextChoices):
        PENDING = "pending"
        SENT = "sent"
        DROPPED = "dropped"

    approval = models.ForeignKey(Approval, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    tag = models.CharField(max_length=150)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField()
    claimed_until = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    send_error = models.TextField(blank=True)

    class Meta:
        # The table monitoring's migrations made; the model moved here, the table stayed.
        db_table = "monitoring_approvalnotice"
        constraints = [
            models.UniqueConstraint(
                fields=["approval", "kind", "tag"], name="approval_notice_once"
            ),
        ]
        indexes = [
            models.Index(
                fields=["created_at", "id"],
                condition=Q(status="pending"),
                name="approval_notice_pending",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} of {self.approval_id} to {self.tag} ({self.status})"
