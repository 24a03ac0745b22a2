"""The console's URLs and a view that fails, for the server error page's tests."""

from __future__ import annotations

from django.db import OperationalError
from django.http import HttpRequest, HttpResponse
from django.urls import path

from settle.urls import handler404, handler500
from settle.urls import urlpatterns as console_urlpatterns


def fails(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("a bug the console did not foresee")


def database_gone(request: HttpRequest) -> HttpResponse:
    raise OperationalError("server closed the connection unexpectedly")


urlpatterns = [
    path("fails/", fails),
    path("database-gone/", database_gone),
    *console_urlpatterns,
]

__all__ = ["handler404", "handler500", "urlpatterns"]
