"""The people page: who uses the console, their open sessions, and ending them.

For supervisors (``supervises_any_provider``): another user gets 403. A supervisor sees the
people of the providers they supervise and may end their sessions; a person outside
them is a 404. Deactivating is a superuser's alone (403 for a supervisor).
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST, require_safe

from common.actors import Actor
from identity.selectors import people_for_user
from identity.sessions import sessions_end, user_deactivate
from recovery.selectors.access import supervises_any_provider


def _supervisor_required(request: HttpRequest) -> None:
    if not supervises_any_provider(user=request.user):
        raise PermissionDenied("supervisors only")


def _person_for_supervisor(request: HttpRequest, user_id: int) -> User:
    """The person ``user_id`` if this supervisor may see them; 404 whether absent or hidden."""
    _supervisor_required(request)
    person = people_for_user(user=request.user).filter(pk=user_id).first()
    if person is None:
        raise Http404("no such person")
    return person


@login_required
@require_safe
def people(request: HttpRequest) -> HttpResponse:
    _supervisor_required(request)
    return render(request, "console/people.html", {"people": people_for_user(user=request.user)})


@login_required
@require_POST
def people_sessions_end(request: HttpRequest, user_id: int) -> HttpResponse:
    person = _person_for_supervisor(request, user_id)
    ended = sessions_end(user=person, actor=Actor.of("user", request.user), reason="ended")
    messages.success(
        request, f"Ended {ended} session{'' if ended == 1 else 's'} of {person.get_username()}."
    )
    return redirect("people")


@login_required
@require_POST
def people_deactivate(request: HttpRequest, user_id: int) -> HttpResponse:
    person = _person_for_supervisor(request, user_id)
    if not request.user.is_superuser:
        raise PermissionDenied("superusers only")
    if person.pk == request.user.pk:
        messages.error(request, "You cannot deactivate yourself.")
    elif person.is_active:
        user_deactivate(user=person, actor=Actor.of("user", request.user))
        messages.success(request, f"Deactivated {person.get_username()}; their sessions ended.")
    return redirect("people")
