"""The customer's pages: reached by a link's token alone, never by a console session."""

from __future__ import annotations

from django.urls import URLPattern, path

from customers.views import approve, enrol

urlpatterns: list[URLPattern] = [
    path("approve/", approve.approve_page, name="customer-approve"),
    path("approve/state", approve.approve_state, name="customer-approve-state"),
    path("approve/decide", approve.approve_decide, name="customer-approve-decide"),
    path("approve/sign", approve.approve_sign, name="customer-approve-sign"),
    path("enrol/", enrol.enrol_page, name="customer-enrol"),
    path("enrol/options", enrol.enrol_options, name="customer-enrol-options"),
    path("enrol/finish", enrol.enrol_finish, name="customer-enrol-finish"),
]
