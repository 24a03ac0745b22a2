"""Health check and the error pages: JSON under /api/, HTML elsewhere."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.template import loader
from django.views.decorators.http import require_safe


@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"ok": True, "database": connection.vendor})


def _wants_json(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


def not_found(request: HttpRequest, exception: Any = None) -> HttpResponse:
    if _wants_json(request):
        return JsonResponse({"error": "not_found", "message": "no such endpoint"}, status=404)
    return render(request, "404.html", status=404)


def server_error(request: HttpRequest) -> HttpResponse:
    if _wants_json(request):
        return JsonResponse({"error": "internal_error", "message": "unexpected error"}, status=500)
    # As Django's own server_error: no request context, so no context processor (nor
    # the database it may need) runs while something is already broken.
    return HttpResponse(loader.get_template("500.html").render(), status=500)
