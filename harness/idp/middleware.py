"""The IdP's clients, from the clients file the tests write (``IdentityProvider.client``).

Before each request, if the file changed since the last one, its clients are written to
the IdP's database (created or updated), so the request that follows a test's change
already knows the client: no restart, and no second writer of the SQLite file.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

from allauth.idp.oidc.models import Client
from django.conf import settings
from django.db import transaction
from django.http import HttpRequest, HttpResponse

from harness.idp.directory import CLIENTS_FILE

_lock = threading.Lock()
_synced: str | None = None


def _sync() -> None:
    global _synced
    path = settings.STATE_DIR / CLIENTS_FILE
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        return
    with _lock:
        if text == _synced:
            return
        with transaction.atomic():
            for client_id, spec in json.loads(text).items():
                client = Client.objects.filter(id=client_id).first() or Client(id=client_id)
                client.name = client_id
                client.type = Client.Type.CONFIDENTIAL
                client.set_secret(spec["secret"])
                client.set_redirect_uris(spec["redirect_uris"])
                client.set_scopes(["openid", "profile", "email"])
                client.set_grant_types([Client.GrantType.AUTHORIZATION_CODE])
                client.set_response_types([Client.ResponseType.CODE])
                client.skip_consent = True
                client.save()
        _synced = text


Handler = Callable[[HttpRequest], HttpResponse]


def clients_sync(get_response: Handler) -> Handler:
    def middleware(request: HttpRequest) -> HttpResponse:
        _sync()
        return get_response(request)

    return middleware
