"""The approval link's page: the customer reads the exact action and approves or declines.

The link's token travels in the URL's fragment (``common.links``), which no request
carries: ``GET /approve/`` serves the same page to everyone and reads nothing; its
script sends the token in POST bodies to ``state`` (what the page shows) and ``decide``
(the decision, with the CSRF token of the page and the digest the customer was shown).
A link previewer's GET, a token in a query string, a forged form: none decides.
"""

from __future__ import annotations

import uuid

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.shortcuts import render
from django.utils import translation
from django.utils.translation import gettext_lazy as _
from django.views.decorators.csrf import csrf_exempt, ensure_csrf_cookie
from django.views.decorators.http import require_GET, require_POST

from common.actors import Actor
from common.errors import ErrorCode, SettleError
from customers.links import approval_for_token
from customers.pages import LinkRefused, customer_page, link_refusal_record, tries_count
from customers.passkeys import decision_signed_record, decision_signing_begin, rp_id
from customers.selectors import customer_approval, customer_permit_seconds
from recovery.services.permits import approval_decision

TEMPLATE = "customers/approve.html"
REASON_LENGTH = 500
# What the page says of each refusal, in the customer's words; any other: ``OTHER``.
REFUSALS = {
    ErrorCode.LINK_INVALID: _("This link is not valid. Ask for a new one."),
    ErrorCode.LINK_RATE_LIMITED: _(
        "Too many tries from your network. Wait a minute, then try again."
    ),
    ErrorCode.APPROVAL_EXPIRED: _("This request has expired. Nothing was decided."),
    ErrorCode.ALREADY_DECIDED: _("This request was already decided."),
    ErrorCode.DIGEST_MISMATCH: _("The request changed since you opened it. Reload the page."),
    ErrorCode.PASSKEY_REQUIRED: _("This decision must be signed with your passkey."),
    ErrorCode.CSRF_FAILED: _("Your session expired. Reload the page."),
    ErrorCode.PARTY_NO_PASSKEY: _(
        "No passkey is set up for you yet. Ask the app that sent you this link to set one up."
    ),
    ErrorCode.PARTY_PASSKEY_UNKNOWN: _(
        "That passkey is not set up for you here. Nothing was decided."
    ),
    ErrorCode.SIGNATURE_INVALID: _("Your passkey's signature could not be checked. Try again."),
    ErrorCode.SIGN_COUNT_REPLAYED: _("Your passkey's signature could not be checked. Try again."),
}
OTHER = _("Your decision could not be recorded. Nothing was decided.")


@customer_page
@require_GET
@ensure_csrf_cookie
def approve_page(request: HttpRequest) -> HttpResponse:
    """The page every link opens: it reads no token and changes nothing."""
    return render(request, TEMPLATE, {})


def _csrf_check(request: HttpRequest) -> None:
    """The page's CSRF token, checked here rather than by the middleware, so that a
    refusal is the page's own answer (its code, its headers, its language)."""
    if CsrfViewMiddleware(lambda r: HttpResponse()).process_view(
        request, lambda r: HttpResponse(), (), {}
    ):
        raise SettleError(ErrorCode.CSRF_FAILED)


def _approval_id(request: HttpRequest) -> uuid.UUID:
    _csrf_check(request)
    tries_count(request)
    approval_id = approval_for_token(request.POST.get("token", ""))
    if approval_id is None:
        link_refusal_record(ErrorCode.LINK_INVALID, request)
        raise LinkRefused(ErrorCode.LINK_INVALID)
    return approval_id


def _refused(request: HttpRequest, exc: SettleError) -> HttpResponse:
    message = REFUSALS.get(exc.code, OTHER)
    context = {"code": str(exc.code), "message": message}
    return render(request, f"{TEMPLATE}#refused", context, status=exc.status)


def _shown(request: HttpRequest, approval_id: uuid.UUID, status: int = 200) -> HttpResponse:
    page = customer_approval(approval_id=approval_id, locale=translation.get_language())
    # Where the decision must be signed: whether the party has a passkey to sign it with.
    has_passkey = page.party.passkeys.filter(removed_at=None).exists()
    context = {"page": page, "has_passkey": has_passkey}
    return render(request, f"{TEMPLATE}#approval", context, status=status)


def _decision(request: HttpRequest) -> str:
    decision = request.POST.get("decision", "")
    if decision not in ("approve", "deny"):
        raise SettleError(ErrorCode.INVALID_FIELD, "decision: approve or deny")
    return decision


@csrf_exempt  # checked in _approval_id, answered as the page's refusal
@customer_page
@require_POST
def approve_state(request: HttpRequest) -> HttpResponse:
    """What the link's approval asks and how it stands (reads only)."""
    try:
        return _shown(request, _approval_id(request))
    except SettleError as exc:
        return _refused(request, exc)


@csrf_exempt  # checked in _approval_id, answered as the page's refusal
@customer_page
@require_POST
def approve_decide(request: HttpRequest) -> HttpResponse:
    """The customer's decision, on the digest they were shown; then the page as it stands."""
    try:
        approval_id = _approval_id(request)
        page = customer_approval(approval_id=approval_id, locale=translation.get_language())
        decision = _decision(request)
        # Signed with the party's passkey (customer_passkey): the statement Settle made
        # at ``sign``, checked against the party's own passkeys before it decides.
        signature = None
        if request.POST.get("credential"):
            signature = decision_signed_record(
                approval=page.approval,
                party=page.party,
                decision=decision,
                signed_statement=request.POST.get("statement", ""),
                credential=request.POST["credential"],
                relying_party=rp_id(request),
            )
        approval_decision(
            approval_id=approval_id,
            approve=decision == "approve",
            ttl_seconds=customer_permit_seconds(approval=page.approval),
            decided_by=Actor.party(page.party),
            reviewed_digest=request.POST.get("params_digest", ""),
            reason=request.POST.get("reason", "").replace("\x00", "").strip()[:REASON_LENGTH],
            signature=signature,
        )
    except SettleError as exc:
        return _refused(request, exc)
    return _shown(request, approval_id)


@csrf_exempt  # checked in _approval_id, answered as the page's refusal
@customer_page
@require_POST
def approve_sign(request: HttpRequest) -> HttpResponse:
    """What the page needs to sign the customer's decision with their passkey: the
    options for ``navigator.credentials.get`` and the statement (JSON); or why not."""
    try:
        approval_id = _approval_id(request)
        page = customer_approval(approval_id=approval_id, locale=translation.get_language())
        if page.stage != "pending" or page.voted:
            raise SettleError(ErrorCode.ALREADY_DECIDED)
        begun = decision_signing_begin(
            approval=page.approval,
            party=page.party,
            decision=_decision(request),
            relying_party=rp_id(request),
        )
    except SettleError as exc:
        return _refused(request, exc)
    return JsonResponse(begun)
