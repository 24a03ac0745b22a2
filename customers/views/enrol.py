"""The enrolment page: a customer registers a passkey from the host's one-time link.

The token is in the URL's fragment (``/enrol/#<token>``): the page's script reads it and
sends it in POST bodies only, so it never reaches an access log or a ``Referer``. GET
shows the page and changes nothing; ``enrol/options`` gives the registration options,
``enrol/finish`` verifies the browser's answer and enrols the passkey, using the link up.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils.translation import gettext_lazy as _
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.decorators.http import require_GET, require_POST

from common.errors import ErrorCode, SettleError
from customers.pages import customer_page, tries_count
from customers.passkeys import enrolment_finish, enrolment_options, rp_id

# A registration answer and its state are a few kilobytes; anything far larger is not one.
MAX_BODY = 64 * 1024


# What the page says of each refusal, in the customer's words; any other: ``OTHER``.
REFUSALS = {
    ErrorCode.ENROLMENT_UNKNOWN: _("This link is not valid. Ask the app for a new one."),
    ErrorCode.ENROLMENT_USED: _("This link was used already. Ask the app for a new one."),
    ErrorCode.ENROLMENT_EXPIRED: _("This link has expired. Ask the app for a new one."),
    ErrorCode.LINK_RATE_LIMITED: _(
        "Too many tries from your network. Wait a minute, then try again."
    ),
    ErrorCode.REGISTRATION_INVALID: _("Your phone's passkey could not be checked. Try again."),
}
OTHER = _("No passkey was added. Ask the app for a new link.")


def _refused(code: ErrorCode) -> JsonResponse:
    """The stable code, and what it means in the customer's language."""
    message = str(REFUSALS.get(code, OTHER))
    return JsonResponse({"error": code, "message": message}, status=code.status)


def _body(request: HttpRequest) -> dict[str, Any]:
    # Counted with the approval links' tries from this address (SETTLE_LINK_TRIES_PER_MINUTE).
    tries_count(request)
    if len(request.body) > MAX_BODY:
        raise SettleError(ErrorCode.BODY_TOO_LARGE)
    try:
        body = json.loads(request.body)
    except (ValueError, UnicodeDecodeError):
        raise SettleError(ErrorCode.MALFORMED_JSON) from None
    if not isinstance(body, dict) or not isinstance(body.get("token", ""), str):
        raise SettleError(ErrorCode.INVALID_BODY)
    return body


@customer_page
@require_GET
@ensure_csrf_cookie
def enrol_page(request: HttpRequest) -> HttpResponse:
    return render(request, "customers/enrol.html")


@customer_page
@require_POST
def enrol_options(request: HttpRequest) -> HttpResponse:
    """The registration options for the link's party, or why the link cannot enrol."""
    try:
        body = _body(request)
        return JsonResponse(
            enrolment_options(token=body.get("token", ""), relying_party=rp_id(request))
        )
    except SettleError as exc:
        return _refused(exc.code)


@customer_page
@require_POST
def enrol_finish(request: HttpRequest) -> HttpResponse:
    """Verify the browser's registration and enrol the passkey (the link is used up)."""
    try:
        body = _body(request)
        credential, state = body.get("credential"), body.get("state")
        name = body.get("name", "")
        if not isinstance(credential, dict) or not isinstance(state, str):
            raise SettleError(ErrorCode.INVALID_BODY, "credential and state are required")
        if not isinstance(name, str):
            raise SettleError(ErrorCode.INVALID_FIELD, "name: text")
        passkey = enrolment_finish(
            token=body.get("token", ""),
            signed_state=state,
            credential=credential,
            relying_party=rp_id(request),
            name=name.strip(),
        )
    except SettleError as exc:
        return _refused(exc.code)
    return JsonResponse({"enrolled": True, "name": passkey.name}, status=201)
