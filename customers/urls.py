"""The customer's pages: reached by a link's token alone, never by a console session."""

from __future__ import annotations

from django.urls import URLPattern, path

from customers.views import enrol

urlpatterns: list[URLPattern] = [
    path("enrol/", enrol.enrol_page, name="customer-enrol"),
    path("enrol/options", enrol.enrol_options, name="customer-enrol-options"),
    path("enrol/finish", enrol.enrol_finish, name="customer-enrol-finish"),
]
