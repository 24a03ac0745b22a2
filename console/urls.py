from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from console import views

urlpatterns = [
    path("", views.home, name="home"),
    path("healthz", views.healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("api/", include("recovery.urls")),
]

handler404 = "console.views.not_found"
handler500 = "console.views.server_error"
