from __future__ import annotations

import re

from allauth.account.views import LogoutView
from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path, re_path, register_converter
from django.urls.converters import StringConverter
from django.views.generic import RedirectView

from console.views import (
    approvals,
    audit,
    bulk,
    dashboard,
    operations,
    people,
    policy,
    queue,
    reconcile,
    system,
    webhooks,
)
from identity.views import SignInView, passkey_required
from recovery.contract import KEY_PATTERN

_KEY = re.compile(KEY_PATTERN)


class OperationKeyConverter(StringConverter):
    """An operation key as the host API accepts it: anything else (a NUL byte) is a 404.

    Checked in ``to_python`` rather than by ``regex``, so that a link to a chain that no
    key names (a tampered audit row the trail shows) still reverses.
    """

    def to_python(self, value: str) -> str:
        if not _KEY.fullmatch(value):
            raise ValueError("not an operation key")
        return value


register_converter(OperationKeyConverter, "key")

urlpatterns = [
    # First: every host's request is resolved here, and the resolver tries the patterns in
    # order: the console's sixty patterns before it cost each API request 0.18 ms of CPU
    # in 2.6 (bench/api_profile.py's lifecycle, in process, alternated).
    path("api/", include("recovery.urls")),
    path("", queue.home, name="home"),
    path("", include("customers.urls")),
    path("operations/<key:key>/", operations.operation_detail, name="operation"),
    path("operations/<key:key>/lookup", operations.operation_lookup, name="operation-lookup"),
    path(
        "operations/<key:key>/permits/<str:permit_id>/history",
        operations.permit_history_view,
        name="operation-permit-history",
    ),
    *(
        path(
            f"operations/<key:key>/{action}",
            reconcile.operation_decide,
            {"action": action},
            name=f"operation-{action}",
        )
        for action in reconcile.DECISIONS
    ),
    path("operations/<key:key>/claim", reconcile.operation_claim_view, name="operation-claim"),
    path(
        "operations/<key:key>/release", reconcile.operation_release_view, name="operation-release"
    ),
    path("approvals/", approvals.approvals, name="approvals"),
    path("approvals/<uuid:approval_id>/", approvals.approval_detail, name="approval"),
    path(
        "approvals/<uuid:approval_id>/decide",
        approvals.approval_decide_view,
        name="approval-decide",
    ),
    path("approvals/<uuid:approval_id>/sign", approvals.approval_sign, name="approval-sign"),
    path("reconciliations/", reconcile.reconciliations, name="reconciliations"),
    path(
        "reconciliations/<int:request_id>/sign",
        reconcile.reconciliation_sign,
        name="reconciliation-sign",
    ),
    path("policy/", policy.policy, name="policy"),
    *(
        path(
            f"reconciliations/<int:request_id>/{decision}",
            reconcile.reconciliation_decide,
            {"decision": decision},
            name=f"reconciliation-{decision}",
        )
        for decision in ("approve", "reject")
    ),
    path("bulk/preview", bulk.bulk_preview, name="bulk-preview"),
    path("bulk/", bulk.bulk_submit_view, name="bulk-submit"),
    path("batches/", bulk.bulk_batches, name="bulk-batches"),
    path("batches/<uuid:batch_id>/", bulk.bulk_batch, name="bulk-batch"),
    path("batches/<uuid:batch_id>/report.csv", bulk.bulk_report_csv, name="bulk-report-csv"),
    path("batches/<uuid:batch_id>/sign", bulk.bulk_sign, name="bulk-sign"),
    *(
        path(
            f"batches/<uuid:batch_id>/{decision}",
            bulk.bulk_decide_view,
            {"decision": decision},
            name=f"bulk-{decision}",
        )
        for decision in ("approve", "reject")
    ),
    # django-allauth's sign-in (a password, a passkey, or single sign-on) and sign-out.
    path("login/", SignInView.as_view(), name="login"),
    # A POST, from the sign-out button on every page (a GET would be a link to forge).
    path("logout/", LogoutView.as_view(http_method_names=["post", "options"]), name="logout"),
    # allauth's other pages: single sign-on's callbacks, passkeys, password change. No
    # mail is sent, so none that needs mail (reset by e-mail, e-mail addresses).
    re_path(r"^accounts/(password/reset|email|confirm-email|signup)/", system.not_found),
    # Passkeys are the only second factor: allauth's two-factor overview is their list.
    path("accounts/2fa/", RedirectView.as_view(pattern_name="mfa_list_webauthn")),
    path("passkey-required/", passkey_required, name="passkey-required"),
    path("accounts/", include("allauth.urls")),
    path("dashboard/", dashboard.dashboard, name="dashboard"),
    path("audit/", audit.audit_trail, name="audit"),
    path("audit/export.csv", audit.audit_export_csv, name="audit-export-csv"),
    path("audit/export.jsonl", audit.audit_export_jsonl, name="audit-export-jsonl"),
    path("audit/exports/", audit.audit_export_start, name="audit-export-start"),
    path("audit/exports/<uuid:export_id>/", audit.audit_export_page, name="audit-export"),
    path(
        "audit/exports/<uuid:export_id>/download",
        audit.audit_export_download,
        name="audit-export-download",
    ),
    path(
        "audit/alarms/<int:alarm_id>/resolve",
        audit.audit_alarm_resolve_view,
        name="audit-alarm-resolve",
    ),
    path("webhooks/", webhooks.webhook_endpoints, name="webhooks"),
    path("webhooks/<int:endpoint_id>/", webhooks.webhook_endpoint, name="webhook-endpoint"),
    path(
        "webhooks/<int:endpoint_id>/deliveries/<int:message_id>/redeliver",
        webhooks.webhook_redeliver,
        name="webhook-redeliver",
    ),
    # Who uses the console, and their sessions (identity.sessions).
    path("people/", people.people, name="people"),
    path("people/<int:user_id>/end-sessions", people.people_sessions_end, name="people-end"),
    path("people/<int:user_id>/deactivate", people.people_deactivate, name="people-deactivate"),
    # Browsers and tools that ask for it whatever the page says.
    path("favicon.ico", RedirectView.as_view(url=static("settle/favicon.svg"), permanent=True)),
    path("healthz", system.healthz, name="healthz"),
    path("livez", system.livez, name="livez"),
    path("status/", system.status, name="status"),
    path("metrics", system.metrics, name="metrics"),
    path("admin/", admin.site.urls),
]

handler403 = "console.views.system.forbidden"
handler404 = "console.views.system.not_found"
handler500 = "console.views.system.server_error"
