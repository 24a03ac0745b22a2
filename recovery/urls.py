from __future__ import annotations

from django.urls import path

from recovery import api, api_parties

urlpatterns = [
    path("openapi.json", api.openapi, name="openapi"),
    path("v1/operations", api.operations, name="api-operations"),
    path("v1/operations/<str:key>", api.operation_detail, name="api-operation"),
    path("v1/operations/<str:key>/history", api.operation_history),
    path("v1/operations/<str:key>/approvals", api.operation_approvals),
    path("v1/operations/<str:key>/dispatch", api.operation_dispatch),
    path("v1/operations/<str:key>/heartbeat", api.operation_heartbeat),
    path("v1/operations/<str:key>/result", api.operation_result),
    path("v1/operations/<str:key>/resume", api.operation_resume),
    path("v1/approvals/<str:approval_id>", api.approval_detail),
    path("v1/approvals/<str:approval_id>/decision", api.approval_decision_view),
    path("v1/permits/<str:permit_id>/revoke", api.permit_revoke_view),
    path("v1/providers/<str:name>/callbacks", api.provider_callbacks),
    path("v1/parties/<str:party>", api_parties.party_detail),
    path("v1/parties/<str:party>/enrolments", api_parties.party_enrolments),
    path("v1/parties/<str:party>/passkeys/<str:passkey_id>", api_parties.party_passkey_revoke),
]
