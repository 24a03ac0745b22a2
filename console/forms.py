"""Forms of the console: the queue's and the audit trail's filters, read from the URL."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django import forms
from django.forms.utils import flatatt
from django.http import QueryDict
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from audit.kinds import AuditKind
from console.selectors.approvals import InboxFilters
from console.selectors.audit_trail import AuditFilters
from recovery.models import Verdict
from recovery.selectors.queue import QUEUE_AGES, QUEUE_REASONS, QUEUE_STRANDED, QueueFilters
from recovery.vocabulary import WaitReason

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
# The queue's reasons, short enough for a filter beside five others.
_SHORT_REASONS: dict[str, str] = {
    WaitReason.LEASE_LOST: "Lease lapsed",
    WaitReason.MISMATCH: "Evidence mismatch",
    WaitReason.CORRUPT: "Evidence corrupt",
    WaitReason.CONFLICT: "Contradicts report",
    WaitReason.LOOKUP_BUDGET_SPENT: "Lookup budget spent",
    WaitReason.STRANDED: "Stranded receipt",
}


def cursor_encode(after: tuple[datetime, int]) -> str:
    """``<microseconds since the epoch>.<id>``: exact, short and safe in a URL."""
    at, pk = after
    return f"{(at - _EPOCH) // _MICROSECOND}.{pk}"


def page_queries(query: QueryDict, cursor: str | None) -> dict[str, str | None]:
    """The query strings a keyset-paged list links to, its filters kept.

    ``next_query``: the page after ``cursor`` (None on the last page); ``first_query``:
    the first page (None when this is it); ``unpaged_query``: the filters alone.
    """
    unpaged = query.copy()
    unpaged.pop("after", None)
    following = None
    if cursor is not None:
        after = query.copy()
        after["after"] = cursor
        following = after.urlencode()
    return {
        "next_query": following,
        "first_query": unpaged.urlencode() if query.get("after") else None,
        "unpaged_query": unpaged.urlencode(),
    }


def cursor_decode(value: str) -> tuple[datetime, int]:
    micros, _, pk = value.partition(".")
    try:
        return _EPOCH + int(micros) * _MICROSECOND, int(pk)
    except (ValueError, OverflowError):
        raise forms.ValidationError("not a page of this queue") from None


class PlainSelect(forms.Select):
    """A ``<select>`` written by one format string, not by the form renderer's template
    for the select and another for each of its options.

    The queue's five filters rendered by Django's ``Select`` measured a millisecond or
    more of the queue page's median, and more with each provider. The same markup
    otherwise: the widget's attributes as the bound field builds them (``id``,
    ``aria-invalid``), and the first option whose value is the field's selected.
    Flat choices only (no groups).
    """

    def render(
        self, name: str, value: Any, attrs: dict[str, Any] | None = None, renderer: Any = None
    ) -> SafeString:
        (chosen,) = self.format_value(value)[:1] or [""]
        selected = False
        options = []
        for option, label in self.choices:
            pick = not selected and str(option) == chosen
            selected = selected or pick
            options.append((option, " selected" if pick else "", label))
        return format_html(
            '<select name="{}"{}>{}</select>',
            name,
            flatatt(self.build_attrs(self.attrs, attrs)),
            format_html_join("", '<option value="{}"{}>{}</option>', options),
        )


class QueueFilterForm(forms.Form):
    """The queue's filters; they live in the URL, so a view can be bookmarked and shared."""

    state = forms.ChoiceField(
        required=False,
        widget=PlainSelect,
        choices=[
            ("", "Any state"),
            ("unknown", "Unknown"),
            ("reconcile", "Reconcile"),
            (QUEUE_STRANDED, "Stranded receipt"),
        ],
    )
    provider = forms.CharField(required=False, max_length=100)
    verdict = forms.ChoiceField(
        required=False,
        label="Latest verdict",
        widget=PlainSelect,
        choices=[("", "Any verdict"), *Verdict.choices, ("none", "No lookup yet")],
    )
    reason = forms.ChoiceField(
        required=False,
        label="Reason",
        widget=PlainSelect,
        choices=[("", "Any reason"), *((code, _SHORT_REASONS[code]) for code in QUEUE_REASONS)],
    )
    age = forms.ChoiceField(
        required=False,
        label="Waiting",
        widget=PlainSelect,
        choices=[("", "Any time"), *((code, age[0]) for code, age in QUEUE_AGES.items())],
    )
    q = forms.CharField(required=False, max_length=200, label="Search")
    # Set by the search's own submit (Enter, the button): an exact id then opens its
    # operation. Typing alone only filters, so that a key that is the start of others
    # does not carry the operator away mid-word.
    jump = forms.BooleanField(required=False)
    after = forms.CharField(required=False, max_length=60)

    def __init__(self, *args: object, providers: list[str], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.fields["provider"] = forms.ChoiceField(
            required=False,
            widget=PlainSelect,
            choices=[("", "Any provider"), *((p, p) for p in providers)],
        )

    def clean_after(self) -> tuple[datetime, int] | None:
        value = self.cleaned_data["after"]
        return cursor_decode(value) if value else None

    def filters(self) -> QueueFilters:
        """The valid filters; an invalid one is dropped (and shown as an error)."""
        data = getattr(self, "cleaned_data", {})
        return QueueFilters(
            state=data.get("state", ""),
            provider=data.get("provider", ""),
            verdict=data.get("verdict", ""),
            search=data.get("q", "").strip(),
            reason=data.get("reason", ""),
            age=data.get("age", ""),
        )


class ActionForm(forms.Form):
    """Every operator action: the version the operator saw, and why they act."""

    version = forms.IntegerField(min_value=0, widget=forms.HiddenInput)
    reason = forms.CharField(max_length=500, strip=True)
    # Sent by the confirmation page's own submit: a void is asked about before it is done.
    confirmed = forms.BooleanField(required=False, widget=forms.HiddenInput)


class DecisionForm(forms.Form):
    """Approving or rejecting a four-eyes proposal: why."""

    reason = forms.CharField(max_length=500, strip=True)


class InboxFilterForm(forms.Form):
    """The approvals inbox's filters, in the URL like the queue's."""

    action = forms.CharField(required=False, max_length=200)
    host = forms.CharField(required=False, max_length=100)

    def __init__(self, *args: object, providers: list[str], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.fields["provider"] = forms.ChoiceField(
            required=False,
            widget=PlainSelect,
            choices=[("", "Any provider"), *((p, p) for p in providers)],
        )

    def filters(self) -> InboxFilters:
        """The valid filters; an invalid one is dropped (and shown as an error)."""
        data = getattr(self, "cleaned_data", {})
        return InboxFilters(
            provider=data.get("provider", ""),
            action=data.get("action", "").strip(),
            host=data.get("host", "").strip(),
        )


class ApprovalDecisionForm(forms.Form):
    """Approving or denying an action: the digest the page showed, and why.

    A denial needs a reason (the host and its people are told why); an approval may
    go without one.
    """

    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("deny", "Deny")])
    params_digest = forms.CharField(max_length=71, widget=forms.HiddenInput)
    reason = forms.CharField(required=False, max_length=500, strip=True)

    def clean(self) -> dict[str, object]:
        data = super().clean() or {}
        if data.get("decision") == "deny" and not data.get("reason"):
            self.add_error("reason", "give a reason to deny")
        return data


# Offered as the kind filter's suggestions: every kind the services write.
AUDIT_KINDS = tuple(AuditKind.values)


class AuditFilterForm(forms.Form):
    """The audit trail's filters, in the URL; the page and its exports read the same ones.

    Dates are whole UTC days, both ends included. ``kind`` is free text (the list is
    only a suggestion), so that a kind added later is found without changing the form.
    """

    actor = forms.CharField(
        required=False,
        max_length=200,
        widget=forms.TextInput(attrs={"type": "search", "placeholder": "e.g. user:olivia"}),
    )
    key = forms.CharField(
        required=False,
        max_length=200,
        label="Operation key",
        widget=forms.TextInput(attrs={"type": "search", "placeholder": "the whole key"}),
    )
    kind = forms.CharField(
        required=False,
        max_length=40,
        widget=forms.TextInput(attrs={"type": "search", "list": "audit-kinds"}),
    )
    provider = forms.CharField(required=False, max_length=100)
    since = forms.DateField(
        required=False, label="From", widget=forms.DateInput(attrs={"type": "date"})
    )
    until = forms.DateField(
        required=False, label="To", widget=forms.DateInput(attrs={"type": "date"})
    )
    after = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)

    def __init__(self, *args: object, providers: list[str], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.fields["provider"] = forms.ChoiceField(
            required=False, choices=[("", "Any provider"), *((p, p) for p in providers)]
        )

    def clean_until(self) -> date | None:
        value: date | None = self.cleaned_data["until"]
        if value is not None and value >= date.max:
            raise forms.ValidationError("too far in the future")  # its end has no datetime
        return value

    def clean(self) -> dict[str, object]:
        data = super().clean() or {}
        since, until = data.get("since"), data.get("until")
        if since and until and since > until:
            self.add_error("until", "the end comes before the start")
        return data

    def filters(self) -> AuditFilters:
        """The valid filters; an invalid one is dropped (and shown as an error)."""
        data = getattr(self, "cleaned_data", {})
        since, until = data.get("since"), data.get("until")
        return AuditFilters(
            actor=data.get("actor", "").strip(),
            key=data.get("key", "").strip(),
            kind=data.get("kind", "").strip(),
            provider=data.get("provider", ""),
            since=datetime.combine(since, time.min, UTC) if since else None,
            until=datetime.combine(until, time.min, UTC) + timedelta(days=1) if until else None,
        )

    def query(self) -> dict[str, str]:
        """The valid filters as the URL spells them (for the export links and the record)."""
        data = getattr(self, "cleaned_data", {})
        names = ("actor", "key", "kind", "provider", "since", "until")
        return {name: str(data[name]).strip() for name in names if data.get(name)}


def picks_parse(values: list[str]) -> list[tuple[int, int]] | None:
    """Hand-picked operations as the queue's checkboxes send them, ``<id>.<version>``;
    None if any is not of that form."""
    picks = []
    for value in values:
        ident, dot, version = value.partition(".")
        if not (dot and ident.isdecimal() and version.isdecimal()):
            return None
        if len(ident) > 18 or len(version) > 9:  # beyond the columns' range
            return None
        picks.append((int(ident), int(version)))
    return picks


def moment_encode(at: datetime) -> str:
    """A moment as microseconds since the epoch: exact, and safe in a form."""
    return str((at - _EPOCH) // _MICROSECOND)


class BulkSubmitForm(forms.Form):
    """A bulk action on a selection: which action, why, and (for "all matching") the
    moment the count was shown, so that later arrivals are not swept in."""

    action = forms.ChoiceField(
        choices=[("lookup", "lookup"), ("confirm", "confirm"), ("void", "void")]
    )
    # Not "reason": that is the queue's filter (why an operation waits), sent alongside.
    why = forms.CharField(max_length=500, strip=True)
    until = forms.CharField(required=False, max_length=20)

    def clean_until(self) -> datetime | None:
        value = self.cleaned_data["until"]
        if not value:
            return None
        try:
            return _EPOCH + int(value) * _MICROSECOND
        except (ValueError, OverflowError):
            raise forms.ValidationError("not a moment this page showed") from None
