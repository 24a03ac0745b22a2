"""A software passkey: an EC P-256 key that registers and signs as a WebAuthn
authenticator does (authenticator data, client data JSON, a signature over both).

It is the tests' authenticator, not a stand-in for Settle: what it makes goes through
the same fido2 parsers and signature checks as a browser's, bit for bit. Chromium's
virtual authenticator does the same in the browser tests.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from allauth.mfa.models import Authenticator
from allauth.mfa.signals import authenticator_added, authenticator_removed
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from django.contrib.auth.base_user import AbstractBaseUser
from fido2 import cbor
from fido2.cose import ES256
from fido2.utils import websafe_encode
from fido2.webauthn import AttestationObject, AttestedCredentialData, AuthenticatorData

from common.statements import challenge_of

RP_ID = "localhost"
ORIGIN = "http://localhost:8000"
UP = AuthenticatorData.FLAG.UP
UV = AuthenticatorData.FLAG.UV


class SoftPasskey:
    """One credential, its private key and its sign count."""

    def __init__(self, *, rp_id: str = RP_ID, origin: str = ORIGIN) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.credential_id = os.urandom(32)
        self.counter = 0
        self.rp_id, self.origin = rp_id, origin

    @property
    def cose(self) -> ES256:
        return ES256.from_cryptography_key(self.key.public_key())

    @property
    def public_key(self) -> str:
        """The COSE key, base64url: what ``passkey_added`` records."""
        return websafe_encode(cbor.encode(dict(self.cose)))

    @property
    def id(self) -> str:
        return websafe_encode(self.credential_id)

    def registration(self, name: str = "Work laptop", *, challenge: str = "AAAA") -> dict[str, Any]:
        """allauth's ``Authenticator.data`` of this passkey (a "none" attestation); its
        ``credential`` is the browser's ``create`` answer to ``challenge`` (base64url)."""
        credential = AttestedCredentialData.create(b"\0" * 16, self.credential_id, self.cose)
        auth_data = AuthenticatorData.create(
            hashlib.sha256(self.rp_id.encode()).digest(),
            UP | UV | AuthenticatorData.FLAG.AT,
            0,
            credential,
        )
        client_data = json.dumps(
            {"type": "webauthn.create", "challenge": challenge, "origin": self.origin}
        ).encode()
        return {
            "name": name,
            "credential": {
                "type": "public-key",
                "id": self.id,
                "rawId": self.id,
                "response": {
                    "clientDataJSON": websafe_encode(client_data),
                    "attestationObject": websafe_encode(
                        AttestationObject.create("none", auth_data, {})
                    ),
                    "transports": ["internal"],
                },
                "clientExtensionResults": {"credProps": {"rk": True}},
            },
        }

    def assertion(
        self,
        statement: dict[str, Any],
        *,
        flags: AuthenticatorData.FLAG = UP | UV,
        counter: int | None = None,
        origin: str | None = None,
        rp_id: str | None = None,
        type: str = "webauthn.get",
        user_handle: str = "",
    ) -> dict[str, Any]:
        """The browser's ``PublicKeyCredential.toJSON()`` of an assertion over ``statement``.

        Each one counts up, as an authenticator does, unless ``counter`` is given.
        """
        if counter is None:
            self.counter += 1
            counter = self.counter
        client_data = json.dumps(
            {
                "type": type,
                "challenge": websafe_encode(challenge_of(statement)),
                "origin": origin or self.origin,
                "crossOrigin": False,
            },
            separators=(",", ":"),
        ).encode()
        auth_data = AuthenticatorData.create(
            hashlib.sha256((rp_id or self.rp_id).encode()).digest(), flags, counter
        )
        signature = self.key.sign(
            bytes(auth_data) + hashlib.sha256(client_data).digest(), ec.ECDSA(hashes.SHA256())
        )
        return {
            "type": "public-key",
            "id": self.id,
            "rawId": self.id,
            "authenticatorAttachment": "platform",
            "response": {
                "clientDataJSON": websafe_encode(client_data),
                "authenticatorData": websafe_encode(auth_data),
                "signature": websafe_encode(signature),
                "userHandle": user_handle or None,
            },
            "clientExtensionResults": {},
        }

    def record(self, statement: dict[str, Any], **options: Any) -> dict[str, Any]:
        """The stored record of a signed decision (``common.webauthn``)."""
        response = self.assertion(statement, **options)["response"]
        return {
            "statement": statement,
            "credential_id": self.id,
            "authenticator_data": response["authenticatorData"],
            "client_data_json": response["clientDataJSON"],
            "signature": response["signature"],
        }


def passkey_register(user: AbstractBaseUser, passkey: SoftPasskey, name: str = "Work laptop"):
    """Register ``passkey`` for ``user`` as allauth does: its row, then its signal (which
    puts ``passkey_added`` on the audit log)."""
    row = Authenticator.objects.create(
        user=user, type=Authenticator.Type.WEBAUTHN, data=passkey.registration(name)
    )
    authenticator_added.send(sender=Authenticator, request=None, user=user, authenticator=row)
    return row


def passkey_unregister(row: Authenticator) -> None:
    """Remove a passkey as allauth does: the row deleted, then the signal."""
    user = row.user
    row.delete()
    authenticator_removed.send(sender=Authenticator, request=None, user=user, authenticator=row)
