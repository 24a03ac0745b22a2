"""Every stable error code, once, with its HTTP status and a default message.

A service, a Celery task, the host API and a console view raise and handle the same
``SettleError``; the HTTP layers read the status from the code rather than keeping a map
of their own, so the API and the console answer a refusal alike. The codes' text is the
contract: it is stored on refused items and sent as ``{"error": <code>}``, so a member's
value never changes. ``api`` marks the codes the host API can answer with: the OpenAPI
document's ``Error`` enum lists exactly those, in this order.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    """A refusal's stable code; ``status`` is its HTTP status, ``message`` its default text."""

    status: int
    message: str
    api: bool

    # Defaults only so that ``ErrorCode(text)``, which looks a member up, type-checks.
    def __new__(
        cls, value: str, status: int = 409, message: str = "", api: bool = False
    ) -> ErrorCode:
        member = str.__new__(cls, value)
        member._value_ = value
        member.status = status
        member.message = message
        member.api = api
        return member

    # -- the host API's codes, in the order its document lists them ------------------
    # body parsing (recovery.api, common.canonical.strict_loads)
    MALFORMED_JSON = "malformed_json", 400, "the request body is not valid JSON", True
    DUPLICATE_KEY = "duplicate_key", 400, "a JSON object repeats a key", True
    NON_FINITE_NUMBER = "non_finite_number", 400, "a number is not finite", True
    TOO_DEEP = "too_deep", 400, "JSON nesting is too deep", True
    INVALID_BODY = "invalid_body", 400, "the request body must be a JSON object", True
    # field validation (recovery.contract.refusal)
    UNKNOWN_FIELD = "unknown_field", 400, "the body has fields the request does not take", True
    MISSING_FIELD = "missing_field", 422, "a required field is missing", True
    INVALID_FIELD = "invalid_field", 422, "a field's value is not allowed", True
    INVALID_PARAMS = "invalid_params", 422, "the params have no canonical form", True
    PARAMS_TOO_LARGE = "params_too_large", 413, "the params are too large", True
    BODY_TOO_LARGE = "body_too_large", 413, "the request body is too large", True
    UNSUPPORTED_MEDIA_TYPE = (
        "unsupported_media_type",
        415,
        "send Content-Type: application/json",
        True,
    )
    # credentials and permissions
    UNAUTHORIZED = "unauthorized", 401, "an Authorization bearer token is required", True
    FORBIDDEN = "forbidden", 403, "you may not do this", True
    CSRF_FAILED = "csrf_failed", 403, "CSRF token missing or incorrect", True
    BAD_SIGNATURE = "bad_signature", 401, "missing or wrong X-Provider-Signature", True
    # lookups
    UNKNOWN_OPERATION = "unknown_operation", 404, "no such operation", True
    UNKNOWN_PROVIDER = "unknown_provider", 404, "no such provider", True
    UNKNOWN_APPROVAL = "unknown_approval", 404, "no such approval", True
    UNKNOWN_PERMIT = "unknown_permit", 404, "no such permit", True
    UNKNOWN_PARTY = "unknown_party", 404, "no such party for this host", True
    UNKNOWN_PASSKEY = "unknown_passkey", 404, "no such passkey of this party", True
    # business refusals (recovery's services, approvals)
    KEY_CONFLICT = "key_conflict", 409, "the key names a different operation", True
    INVALID_STATE = "invalid_state", 409, "the operation's state does not allow this", True
    STALE_STATE = "stale_state", 409, "the operation changed meanwhile", True
    ALREADY_DECIDED = "already_decided", 409, "it is already decided", True
    DIGEST_MISMATCH = "digest_mismatch", 409, "the params digest does not match", True
    INVALID_TTL = "invalid_ttl", 422, "ttl_seconds is out of range", True
    # a person's decision on an approval (recovery.services.permits)
    ALREADY_VOTED = "already_voted", 409, "you have decided this approval already", True
    APPROVAL_EXPIRED = (
        "approval_expired",
        409,
        "the approval expired before this decision: ask the host to open a new one",
        True,
    )
    PROPOSER_EXCLUDED = "proposer_excluded", 403, "the proposer may not decide it", True
    NOT_IN_GROUP = "not_in_group", 403, "it needs a person from other groups", True
    PASSKEY_REQUIRED = "passkey_required", 403, "this decision must be signed with a passkey", True
    # an approval addressed to a host's customer (a party; customers, recovery.contract)
    PARTY_REQUIRED = (
        "party_required",
        422,
        "the policy asks the customer to decide: name the party when opening it",
        True,
    )
    CUSTOMER_REQUIRED = (
        "customer_required",
        403,
        "this approval awaits the customer's own decision: staff cannot stand in for it",
        True,
    )
    CONTACT_NOT_ALLOWED = (
        "contact_not_allowed",
        422,
        "the party's contact is not a scheme and server the operator allows",
        True,
    )
    # a permit's consumption refused (approvals.services.errors.Refusal)
    NOT_AUTHORIZED = "not_authorized", 409, "no permit authorises this", True
    ACTION_MISMATCH = "action_mismatch", 409, "the permit is for another action", True
    EXPIRED = "expired", 409, "the permit has expired", True
    REVOKED = "revoked", 409, "the permit was revoked", True
    ALREADY_CONSUMED = "already_consumed", 409, "the permit was consumed already", True
    # dispatch
    STALE_FENCING_TOKEN = "stale_fencing_token", 409, "the fencing token is stale", True
    LEASE_LOST = "lease_lost", 409, "the lease is gone", True
    # infrastructure
    METHOD_NOT_ALLOWED = "method_not_allowed", 405, "this method is not allowed here", True
    NOT_FOUND = "not_found", 404, "no such endpoint", True
    DATABASE_UNAVAILABLE = "database_unavailable", 503, "the database is unavailable", True
    INTERNAL_ERROR = "internal_error", 500, "unexpected error", True
    # the rate limit and the history's pages
    RATE_LIMITED = "rate_limited", 429, "too many requests for this credential", True
    INVALID_CURSOR = "invalid_cursor", 400, "after: use the cursor of a next link", True
    INVALID_PAGE_SIZE = "invalid_page_size", 400, "limit is out of range", True
    INVALID_WAIT = "invalid_wait", 400, "wait: a whole number of seconds, 1 to 25", True

    # -- the reason of an invalid_params, never an ``error`` of its own ----------------
    INTEGER_OUT_OF_RANGE = "integer_out_of_range", 422, "an integer is outside ±(2^53-1)"

    # -- providers (the admin, ``manage.py add_provider``) ------------------------------
    # Codes below here that no HTTP layer turns into a 404/403 keep the 409 every refusal
    # outside the host API has always had: the console shows them on the page.
    STALE_VERSION = "stale_version", 409, "it changed meanwhile; reload and retry"
    LOOKUP_IN_FLIGHT = "lookup_in_flight", 409, "a lookup of it is already under way"
    INVALID_ADAPTER = "invalid_adapter", 409, "no such adapter"
    MISSING_PATH = "missing_path", 409, "the adapter needs a path"
    MISSING_URL = "missing_url", 409, "the http adapter needs a URL and a secret"
    INVALID_TIMEOUT = "invalid_timeout", 409, "the timeout is out of range"
    INVALID_LEASE = "invalid_lease", 409, "the lease is too short"
    INVALID_NAME = "invalid_name", 409, "the name has characters a name may not"
    INVALID_PATH = "invalid_path", 409, "the path must be absolute"
    INVALID_URL = "invalid_url", 409, "the URL must be http:// or https:// with a host"
    INVALID_MCP_SECRET = "invalid_mcp_secret", 409, "the mcp adapter's secret is not valid"
    SECRET_TOO_LONG = "secret_too_long", 409, "the secret is longer than 4000 characters"
    INVALID_LOOKUP_BUDGET = "invalid_lookup_budget", 409, "the lookup budget is too small"
    NAME_TAKEN = "name_taken", 409, "another provider has this name"
    # credentials and roles (``manage.py`` commands)
    UNKNOWN_CREDENTIAL = "unknown_credential", 409, "no such credential"
    UNKNOWN_CREDENTIAL_KIND = "unknown_credential_kind", 409, "no such kind of credential"
    EMPTY_SCOPE = "empty_scope", 409, "an approver needs a provider, or all providers"
    UNKNOWN_ROLE = "unknown_role", 409, "no such role"
    UNKNOWN_PERMISSION = "unknown_permission", 409, "no such permission"
    # webhook endpoints (``manage.py webhook``, the admin) and redelivery (the console)
    INVALID_WEBHOOK_URL = "invalid_webhook_url", 409, "the webhook URL is not allowed"
    INVALID_WEBHOOK_EVENTS = "invalid_webhook_events", 409, "no such webhook event"
    UNRESOLVABLE_WEBHOOK_URL = "unresolvable_webhook_url", 409, "the webhook host does not resolve"
    PRIVATE_WEBHOOK_URL = "private_webhook_url", 409, "the webhook host is a private address"
    UNKNOWN_WEBHOOK_ENDPOINT = "unknown_webhook_endpoint", 409, "no such webhook endpoint"
    UNKNOWN_WEBHOOK_MESSAGE = "unknown_webhook_message", 404, "no such webhook message"
    UNKNOWN_HOST = "unknown_host", 409, "no such host"
    # the console's operator actions (reconcile, claims, four-eyes requests)
    NOT_STRANDED = "not_stranded", 409, "the operation is not stranded"
    NOT_ALLOWED = "not_allowed", 409, "the operation's state does not allow this"
    UNKNOWN_ACTION = "unknown_action", 409, "no such operator decision"
    EVIDENCE_MATCHES = "evidence_matches", 409, "the evidence already says so"
    FOUR_EYES_REQUIRED = "four_eyes_required", 409, "a second person must approve this"
    REQUEST_PENDING = "request_pending", 409, "a request for it is already pending"
    SELF_APPROVAL = "self_approval", 409, "you may not approve your own request"
    REQUEST_INVALIDATED = "request_invalidated", 409, "the operation changed since the request"
    CLAIMED = "claimed", 409, "someone else holds a claim on it"
    NOT_CLAIMED = "not_claimed", 409, "nobody holds a claim on it"
    # bulk work from the console
    NOT_BACKED = "not_backed", 409, "the evidence does not back this"
    EMPTY_SELECTION = "empty_selection", 409, "nothing was selected"
    SELECTION_TOO_LARGE = "selection_too_large", 409, "the selection is too large"
    REASON_REQUIRED = "reason_required", 409, "give a reason"
    UNKNOWN_BATCH = "unknown_batch", 409, "no such batch"
    # a supervisor resolving an audit alarm
    RESOLUTION_REQUIRED = "resolution_required", 409, "say what was done about it"
    RESOLUTION_TOO_LONG = "resolution_too_long", 409, "the resolution is too long"
    UNKNOWN_ALARM = "unknown_alarm", 409, "no such alarm"
    ALREADY_RESOLVED = "already_resolved", 409, "the alarm was resolved already"
    # an audit export from the console
    INVALID_FORMAT = "invalid_format", 409, "no such export format"
    UNKNOWN_EXPORT = "unknown_export", 409, "no such export"
    # single sign-on refused (identity.oidc): each a page of its own, and an audit event
    SSO_FAILED = "sso_failed", 401, "the identity provider's answer could not be verified"
    SSO_NONCE_MISMATCH = "sso_nonce_mismatch", 401, "the ID token is not for this sign-in"
    SSO_ISSUER_UNKNOWN = (
        "sso_issuer_unknown",
        401,
        "the ID token's issuer is not the one configured",
    )
    SSO_GROUP_NOT_ALLOWED = "sso_group_not_allowed", 403, "none of your groups may sign in here"
    SSO_EMAIL_TAKEN = "sso_email_taken", 403, "another account has this e-mail address"
    SSO_ACCOUNT_INACTIVE = "sso_account_inactive", 403, "this account is deactivated"
    # a decision signed with a passkey (common.webauthn, identity.passkey_signing)
    NO_PASSKEY = (
        "no_passkey",
        409,
        "register a passkey on the passkeys page first: this decision must be signed",
    )
    PASSKEY_UNKNOWN = "passkey_unknown", 403, "that passkey is not one of yours (or was removed)"
    SIGNATURE_INVALID = (
        "signature_invalid",
        403,
        "the passkey's signature does not hold for this decision",
    )
    SIGN_COUNT_REPLAYED = (
        "sign_count_replayed",
        409,
        "the passkey's sign count did not increase: it may have been copied",
    )
    # a customer's passkey: enrolled from the host's enrolment link, signing their decision
    # (approvals.services.parties, customers.passkeys)
    ENROLMENT_UNKNOWN = "enrolment_unknown", 404, "this enrolment link is not valid"
    ENROLMENT_USED = (
        "enrolment_used",
        409,
        "this enrolment link was used already: ask the app for a new one",
    )
    ENROLMENT_EXPIRED = (
        "enrolment_expired",
        409,
        "this enrolment link has expired: ask the app for a new one",
    )
    REGISTRATION_INVALID = (
        "registration_invalid",
        403,
        "the passkey's registration could not be verified",
    )
    PARTY_NO_PASSKEY = (
        "party_no_passkey",
        409,
        "no passkey is enrolled for you yet: ask the app that sent you this link to enrol one",
    )
    PARTY_PASSKEY_UNKNOWN = (
        "party_passkey_unknown",
        403,
        "that passkey is not enrolled for you here (or was removed): it signs nothing",
    )
    # an approval link refused (customers.views.approve): the page says which
    LINK_INVALID = "link_invalid", 404, "this link is not valid: ask for a new one"
    LINK_RATE_LIMITED = "link_rate_limited", 429, "too many tries: wait a minute and try again"


class SettleError(Exception):
    """A refused request: a stable ``code``, a human ``message`` and details (``extra``).

    Every layer raises and handles this one error; only an HTTP layer turns it into a
    response, with ``code.status``.
    """

    def __init__(self, code: ErrorCode, message: str | None = None, **extra: Any) -> None:
        self.code = ErrorCode(code)
        self.message = self.code.message if message is None else message
        self.extra = extra
        super().__init__(self.message)

    @property
    def status(self) -> int:
        return self.code.status
