"""Forms of the console: the queue's filters, read from the URL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django import forms

from recovery.models import Verdict
from recovery.selectors import QUEUE_AGES, QUEUE_REASONS, QUEUE_STRANDED, QueueFilters

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
# The queue's reasons, short enough for a filter beside five others.
_SHORT_REASONS = {
    "lease_lost": "Lease lapsed",
    "mismatch": "Evidence mismatch",
    "corrupt": "Evidence corrupt",
    "conflict": "Contradicts report",
    "lookup_budget_spent": "Lookup budget spent",
    QUEUE_STRANDED: "Stranded receipt",
}


def cursor_encode(after: tuple[datetime, int]) -> str:
    """``<microseconds since the epoch>.<id>``: exact, short and safe in a URL."""
    at, pk = after
    return f"{(at - _EPOCH) // _MICROSECOND}.{pk}"


def cursor_decode(value: str) -> tuple[datetime, int]:
    micros, _, pk = value.partition(".")
    try:
        return _EPOCH + int(micros) * _MICROSECOND, int(pk)
    except (ValueError, OverflowError):
        raise forms.ValidationError("not a page of this queue") from None


class QueueFilterForm(forms.Form):
    """The queue's filters; they live in the URL, so a view can be bookmarked and shared."""

    state = forms.ChoiceField(
        required=False,
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
        choices=[("", "Any verdict"), *Verdict.choices, ("none", "No lookup yet")],
    )
    reason = forms.ChoiceField(
        required=False,
        label="Reason",
        choices=[("", "Any reason"), *((code, _SHORT_REASONS[code]) for code in QUEUE_REASONS)],
    )
    age = forms.ChoiceField(
        required=False,
        label="Waiting",
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
            required=False, choices=[("", "Any provider"), *((p, p) for p in providers)]
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


class DecisionForm(forms.Form):
    """Approving or rejecting a four-eyes proposal: why."""

    reason = forms.CharField(max_length=500, strip=True)
