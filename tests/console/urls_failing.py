"""The console's URLs and a view that fails, for the server error page's tests."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import path

from console.urls import handler404, handler500
from console.urls import urlpatterns as console_urlpatterns


def fails(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("a bug the console did not foresee")


urlpatterns = [path("fails/", fails), *console_urlpatterns]

__all__ = ["handler404", "handler500", "urlpatterns"]
