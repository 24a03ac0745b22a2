"""A passkey's signature on a statement: the WebAuthn assertion, and checking it.

record
    What is kept of a signed decision (on the vote and in its audit event): the
    ``statement`` (``common.statements``) and the WebAuthn assertion over its challenge,
    base64url: ``credential_id``, ``authenticator_data``, ``client_data_json``,
    ``signature``.

Pure functions over fido2's parsers and its COSE keys: the console's check of a new
signature and the audit log's later check of every stored one are the same code.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Collection, Mapping
from functools import lru_cache
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from fido2 import cbor
from fido2.cose import ES256, CoseKey
from fido2.rpid import verify_rp_id
from fido2.utils import websafe_decode, websafe_encode
from fido2.webauthn import AuthenticationResponse, AuthenticatorData, CollectedClientData

from common.statements import challenge_of

RECORD_FIELDS = ("credential_id", "authenticator_data", "client_data_json", "signature")


class SignatureInvalid(ValueError):
    """A signed record that does not hold; ``reason`` is stable (stored, shown, tested)."""

    MALFORMED = "malformed"
    WRONG_TYPE = "wrong_type"
    WRONG_CHALLENGE = "wrong_challenge"
    WRONG_ORIGIN = "wrong_origin"
    WRONG_RP = "wrong_rp"
    USER_NOT_PRESENT = "user_not_present"
    USER_NOT_VERIFIED = "user_not_verified"
    UNSUPPORTED_KEY = "unsupported_key"
    BAD_SIGNATURE = "bad_signature"

    def __init__(self, reason: str, message: str = "") -> None:
        super().__init__(message or reason)
        self.reason = reason


def assertion_record(
    statement: dict[str, Any], assertion_json: str | Mapping[str, Any]
) -> dict[str, Any]:
    """The signed record of a browser's assertion over ``statement``: what a decision
    keeps and ``assertion_verify`` checks (``SignatureInvalid`` ``malformed`` if the
    assertion does not parse)."""
    try:
        parsed = json.loads(assertion_json) if isinstance(assertion_json, str) else assertion_json
        assertion = AuthenticationResponse.from_dict(parsed)
    # LookupError: a KeyError, or the IndexError of fido2 reading CBOR that stops short.
    except (TypeError, ValueError, LookupError, AttributeError) as exc:
        raise SignatureInvalid(SignatureInvalid.MALFORMED, str(exc)) from None
    response = assertion.response
    return {
        "statement": statement,
        "credential_id": websafe_encode(assertion.raw_id),
        "authenticator_data": websafe_encode(response.authenticator_data),
        "client_data_json": websafe_encode(response.client_data),
        "signature": websafe_encode(response.signature),
    }


@lru_cache(maxsize=1024)
def cose_key(public_key: str) -> CoseKey:
    """The COSE key of its base64url CBOR, parsed once per key (verify_audit meets each
    passkey's key once per signed vote)."""
    decoded = cbor.decode(websafe_decode(public_key))
    if not isinstance(decoded, Mapping):
        raise ValueError("a public key is a COSE map")
    return CoseKey.parse(decoded)


@lru_cache(maxsize=1024)
def _verifier(public_key: str) -> Callable[[bytes, bytes], None]:
    """How to check a signature under ``public_key``: its ``verify(message, signature)``.

    A P-256 key (ES256, what passkeys use) becomes the cryptography key object once,
    which fido2's ``CoseKey.verify`` builds anew from the COSE numbers at every call;
    any other algorithm is left to fido2.
    """
    key = cose_key(public_key)
    if isinstance(key, ES256) and type(key) is ES256 and key.get(-1) == 1:
        numbers = ec.EllipticCurvePublicNumbers(
            int.from_bytes(key[-2], "big"), int.from_bytes(key[-3], "big"), ec.SECP256R1()
        )
        built = numbers.public_key()
        algorithm = ec.ECDSA(hashes.SHA256())
        return lambda message, signature: built.verify(signature, message, algorithm)
    return key.verify


def rp_id_named(record: Mapping[str, Any]) -> str:
    """The relying party the assertion was made for, read from the record itself.

    The origin's host or a domain above it whose SHA-256 the authenticator data names:
    for checking a record later, when the host the browser reached is not at hand.
    """
    assertion = _parsed(record)
    return _rp_id_of(assertion.origin, assertion.rp_id_hash)


# The same few origins and relying parties recur in every record a log holds: each
# pair is worked out once, here and in ``_rp_id_usable``.
@lru_cache(maxsize=256)
def _rp_id_of(origin: str, rp_id_hash: bytes) -> str:
    host = urlsplit(origin).hostname or ""
    labels = host.split(".")
    for start in range(len(labels)):
        candidate = ".".join(labels[start:])
        if hmac.compare_digest(hashlib.sha256(candidate.encode()).digest(), rp_id_hash):
            return candidate
    raise SignatureInvalid(SignatureInvalid.WRONG_RP, "the assertion names no domain of its origin")


# fido2's check that the relying party may be used from the origin.
_rp_id_usable = lru_cache(maxsize=256)(verify_rp_id)

# Authenticator data: the relying party's hash (32 bytes), the flags (1) and the sign
# count (4), then attested credential data and extensions if the flags say so.
_FIXED_PART = 37
_UP = int(AuthenticatorData.FLAG.UP)
_UV = int(AuthenticatorData.FLAG.UV)
_MORE_THAN_FIXED = int(AuthenticatorData.FLAG.AT | AuthenticatorData.FLAG.ED)


class _Assertion(NamedTuple):
    """What ``assertion_verify`` reads of a record: fido2's parse of the client data and
    the authenticator data, kept to the fields checked."""

    client_data: bytes  # the JSON the browser collected, as it was signed
    type: Any
    challenge: bytes
    origin: Any
    cross_origin: Any
    authenticator_data: bytes
    rp_id_hash: bytes
    flags: int
    counter: int
    signature: bytes
    expected: bytes  # the challenge of the record's statement


def _parsed(record: Mapping[str, Any]) -> _Assertion:
    """The record's assertion, its signature and the challenge its statement must have.

    Reads the client data as fido2's ``CollectedClientData`` does, in the same order
    (so a malformed record fails the same way), without its objects: verify_audit
    parses one record per signed vote.
    """
    try:
        client_data = websafe_decode(record["client_data_json"])
        collected = json.loads(client_data.decode())
        kind, challenge = collected["type"], websafe_decode(collected["challenge"])
        origin, cross_origin = collected["origin"], collected.get("crossOrigin", False)
        if not isinstance(kind, str) or not isinstance(origin, str):
            # Compared and split as text below: anything else is no client data.
            raise TypeError("the client data's type and origin are text")
        authenticator_data = websafe_decode(record["authenticator_data"])
        rp_id_hash, flags, counter = _authenticator_fields(authenticator_data)
        return _Assertion(
            client_data,
            kind,
            challenge,
            origin,
            cross_origin,
            authenticator_data,
            rp_id_hash,
            flags,
            counter,
            websafe_decode(record["signature"]),
            challenge_of(record["statement"]),
        )
    # LookupError: a KeyError, or the IndexError of fido2 reading CBOR that stops short.
    except (LookupError, TypeError, ValueError, AttributeError) as exc:
        raise SignatureInvalid(SignatureInvalid.MALFORMED, str(exc)) from None


def _authenticator_fields(data: bytes) -> tuple[bytes, int, int]:
    """The relying party's hash, the flags and the sign count, as fido2's
    ``AuthenticatorData`` reads them.

    An assertion's usual form, the fixed part alone, is sliced here; anything longer
    (attested credential data, extensions, or bytes that do not belong) goes through
    fido2, which parses what follows or refuses it.
    """
    if len(data) == _FIXED_PART and not data[32] & _MORE_THAN_FIXED:
        return data[:32], data[32], int.from_bytes(data[33:], "big")
    parsed = AuthenticatorData(data)
    return parsed.rp_id_hash, int(parsed.flags), parsed.counter


def assertion_verify(
    *,
    public_key: str,
    record: Mapping[str, Any],
    rp_id: str | None,
    origins: Collection[str] | Callable[[str], bool],
) -> int:
    """Check that ``record``'s assertion signs its statement under ``public_key``; return
    the authenticator's sign count.

    The assertion must be a WebAuthn ``get`` for the statement's challenge, from an
    allowed origin (a collection, or a predicate), for ``rp_id``, with the user present
    and verified (unlocked by PIN or biometrics), and its signature must hold. Raises
    ``SignatureInvalid`` with the first reason it fails. ``rp_id`` None: the relying
    party the record names (``rp_id_named``), for a record checked long after, when the
    host the browser reached is not at hand; its origin must still be one it may use.
    """
    assertion = _parsed(record)
    if assertion.type != CollectedClientData.TYPE.GET:
        raise SignatureInvalid(SignatureInvalid.WRONG_TYPE, f"client data of {assertion.type}")
    if not hmac.compare_digest(assertion.challenge, assertion.expected):
        raise SignatureInvalid(SignatureInvalid.WRONG_CHALLENGE, "it signs another statement")
    origin = assertion.origin
    if rp_id is None:
        rp_id = _rp_id_of(origin, assertion.rp_id_hash)
    allowed = origins(origin) if callable(origins) else origin in origins
    # Made in a frame of another site, the browser says so: never a decision of ours.
    if not allowed or assertion.cross_origin or not _rp_id_usable(rp_id, origin):
        raise SignatureInvalid(SignatureInvalid.WRONG_ORIGIN, f"origin {origin}")
    rp_id_hash = hashlib.sha256(rp_id.encode()).digest()
    if not hmac.compare_digest(assertion.rp_id_hash, rp_id_hash):
        raise SignatureInvalid(SignatureInvalid.WRONG_RP, f"not made for {rp_id}")
    if not assertion.flags & _UP:
        raise SignatureInvalid(SignatureInvalid.USER_NOT_PRESENT)
    if not assertion.flags & _UV:
        raise SignatureInvalid(SignatureInvalid.USER_NOT_VERIFIED)
    signed = assertion.authenticator_data + hashlib.sha256(assertion.client_data).digest()
    try:
        _verifier(public_key)(signed, assertion.signature)
    except InvalidSignature:
        raise SignatureInvalid(SignatureInvalid.BAD_SIGNATURE) from None
    except (NotImplementedError, ValueError, KeyError, TypeError) as exc:
        # An algorithm fido2 cannot verify, or a key that is not a COSE key.
        raise SignatureInvalid(SignatureInvalid.UNSUPPORTED_KEY, str(exc)) from None
    return assertion.counter
