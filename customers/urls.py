"""The customer's pages: reached by a link's token alone, never by a console session."""

from __future__ import annotations

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
