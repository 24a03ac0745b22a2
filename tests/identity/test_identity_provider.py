"""The tests' OpenID Connect provider itself (harness/idp), spoken to over HTTP only.

Settle's sign-in tests will trust it to behave as a real IdP and to misbehave exactly as
asked: here a client of the code flow (PKCE, state, nonce) checks what it hands out, the
ID token's signature against its JWKS, and each fault of the directory file.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import jwt
import pytest

from harness.oidc import IdentityProvider, SignInRefused

pytestmark = pytest.mark.processes

CLIENT_ID = "settle-tests"
SECRET = "a-client-secret-for-tests-only"
# Nobody listens there: authorize() stops at the redirect, as a test hands it to Settle.
REDIRECT_URI = "http://localhost:9/accounts/oidc/idp/login/callback/"


@dataclass
class Issued:
    """What one code flow brought back: the tokens, and the ID token's claims, verified."""

    tokens: dict[str, Any]
    claims: dict[str, Any]
    nonce: str


def _http() -> httpx.Client:
    return httpx.Client(trust_env=False, timeout=10.0)


def _discovery(idp: IdentityProvider) -> dict[str, Any]:
    with _http() as http:
        response = http.get(idp.discovery_url)
    assert response.status_code == 200
    document: dict[str, Any] = response.json()
    return document


def _authorize_url(
    idp: IdentityProvider, *, state: str, nonce: str | None, verifier: str | None
) -> str:
    query = {
        "response_type": "code",
        "client_id": CLIENT_ID,
        "redirect_uri": REDIRECT_URI,
        "scope": "openid profile email",
        "state": state,
    }
    if nonce is not None:
        query["nonce"] = nonce
    if verifier is not None:
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
        query["code_challenge"] = challenge.rstrip(b"=").decode()
        query["code_challenge_method"] = "S256"
    return f"{_discovery(idp)['authorization_endpoint']}?{urlencode(query)}"


def _verified(idp: IdentityProvider, id_token: str, **checks: Any) -> dict[str, Any]:
    """The ID token's claims once its signature checks against the IdP's JWKS."""
    with _http() as http:
        keys = jwt.PyJWKSet.from_dict(http.get(_discovery(idp)["jwks_uri"]).json())
    kid = jwt.get_unverified_header(id_token)["kid"]
    key = next(key for key in keys.keys if key.key_id == kid)
    claims: dict[str, Any] = jwt.decode(
        id_token, key.key, algorithms=["RS256"], audience=CLIENT_ID, **checks
    )
    return claims


def _code_flow(
    idp: IdentityProvider,
    username: str,
    *,
    with_nonce: bool = True,
    with_pkce: bool = True,
    secret_in: str = "header",
    **checks: Any,
) -> Issued:
    """Sign ``username`` in through the authorization endpoint, exchange the code.

    ``secret_in``: the client authenticates with HTTP Basic (``header``) or in the form
    (``body``, which allauth's client prefers when discovery offers both).
    """
    state, nonce, verifier = (secrets.token_urlsafe(32) for _ in range(3))
    url = _authorize_url(
        idp,
        state=state,
        nonce=nonce if with_nonce else None,
        verifier=verifier if with_pkce else None,
    )
    back = idp.authorize(url, username)
    assert back.startswith(REDIRECT_URI + "?")
    query = parse_qs(urlsplit(back).query)
    assert query["state"] == [state]
    form = {
        "grant_type": "authorization_code",
        "code": query["code"][0],
        "redirect_uri": REDIRECT_URI,
    }
    if with_pkce:
        form["code_verifier"] = verifier
    auth: tuple[str, str] | None = (CLIENT_ID, SECRET)
    if secret_in == "body":
        form.update(client_id=CLIENT_ID, client_secret=SECRET)
        auth = None
    with _http() as http:
        response = http.post(_discovery(idp)["token_endpoint"], data=form, auth=auth)
    assert response.status_code == 200, response.text
    tokens = response.json()
    checks.setdefault("issuer", idp.issuer)
    return Issued(tokens, _verified(idp, tokens["id_token"], **checks), nonce)


def _userinfo(idp: IdentityProvider, access_token: str) -> dict[str, Any]:
    with _http() as http:
        response = http.get(
            _discovery(idp)["userinfo_endpoint"],
            headers={"Authorization": f"Bearer {access_token}"},
        )
    assert response.status_code == 200, response.text
    userinfo: dict[str, Any] = response.json()
    return userinfo


@pytest.fixture
def idp_alice(idp: IdentityProvider) -> IdentityProvider:
    """The IdP with this module's client, and Alice (an operator) in its directory."""
    idp.client(client_id=CLIENT_ID, secret=SECRET, redirect_uris=[REDIRECT_URI])
    idp.directory.person("alice", groups=["settle-operators"])
    return idp


def test_discovery_names_the_issuer_its_keys_and_endpoints(idp: IdentityProvider) -> None:
    document = _discovery(idp)
    assert idp.issuer.startswith("http://localhost:")
    assert document["issuer"] == idp.issuer
    for endpoint in ("authorization_endpoint", "token_endpoint", "userinfo_endpoint", "jwks_uri"):
        assert document[endpoint].startswith(idp.issuer + "/")
    assert "S256" in document["code_challenge_methods_supported"]
    with _http() as http:
        keys = http.get(document["jwks_uri"]).json()["keys"]
    assert [(key["kty"], bool(key["kid"])) for key in keys] == [("RSA", True)]


def test_a_code_flow_hands_out_a_signed_id_token_with_the_directorys_claims(
    idp_alice: IdentityProvider,
) -> None:
    issued = _code_flow(idp_alice, "alice")
    claims = issued.claims
    assert claims["iss"] == idp_alice.issuer
    assert claims["aud"] == CLIENT_ID
    assert claims["nonce"] == issued.nonce
    assert claims["email"] == "alice@example.com"
    assert claims["email_verified"] is True
    assert claims["name"] == "Alice"
    assert claims["groups"] == ["settle-operators"]
    assert claims["sub"]
    # Userinfo tells the same of the same person.
    userinfo = _userinfo(idp_alice, issued.tokens["access_token"])
    assert userinfo["sub"] == claims["sub"]
    assert userinfo["email"] == "alice@example.com"
    assert userinfo["groups"] == ["settle-operators"]


def test_a_flow_without_nonce_or_pkce_and_the_secret_in_the_body_works_too(
    idp_alice: IdentityProvider,
) -> None:
    """What allauth's openid_connect client sends unless told otherwise: no nonce, no
    PKCE, client_secret_post."""
    issued = _code_flow(idp_alice, "alice", with_nonce=False, with_pkce=False, secret_in="body")
    assert "nonce" not in issued.claims
    assert issued.claims["groups"] == ["settle-operators"]


def test_the_sub_is_stable_and_the_directory_may_set_it(idp_alice: IdentityProvider) -> None:
    first = _code_flow(idp_alice, "alice").claims["sub"]
    assert _code_flow(idp_alice, "alice").claims["sub"] == first
    idp_alice.directory.person("bob", groups=[], sub="bob-at-the-idp")
    assert _code_flow(idp_alice, "bob").claims["sub"] == "bob-at-the-idp"


def test_a_change_of_groups_counts_from_the_next_token(idp_alice: IdentityProvider) -> None:
    assert _code_flow(idp_alice, "alice").claims["groups"] == ["settle-operators"]
    idp_alice.directory.groups("alice", ["settle-viewers", "finance"])
    issued = _code_flow(idp_alice, "alice")
    assert issued.claims["groups"] == ["settle-viewers", "finance"]
    assert _userinfo(idp_alice, issued.tokens["access_token"])["groups"] == [
        "settle-viewers",
        "finance",
    ]


def test_the_groups_claim_is_named_by_the_directory(idp_alice: IdentityProvider) -> None:
    idp_alice.directory.groups_claim("roles")
    issued = _code_flow(idp_alice, "alice")
    assert issued.claims["roles"] == ["settle-operators"]
    assert "groups" not in issued.claims
    assert _userinfo(idp_alice, issued.tokens["access_token"])["roles"] == ["settle-operators"]


def test_the_nonce_fault_gives_a_nonce_other_than_the_requests(
    idp_alice: IdentityProvider,
) -> None:
    idp_alice.directory.fault(nonce="wrong")
    issued = _code_flow(idp_alice, "alice")
    assert issued.claims["nonce"] != issued.nonce
    idp_alice.directory.clear_faults()
    issued = _code_flow(idp_alice, "alice")
    assert issued.claims["nonce"] == issued.nonce


def test_the_expired_fault_gives_a_token_past_its_exp(idp_alice: IdentityProvider) -> None:
    idp_alice.directory.fault(expired=True)
    issued = _code_flow(idp_alice, "alice", options={"verify_exp": False})
    # Past by an hour: beyond any clock leeway a client allows.
    assert issued.claims["exp"] < time.time() - 3000
    with pytest.raises(jwt.ExpiredSignatureError):
        _verified(idp_alice, issued.tokens["id_token"], issuer=idp_alice.issuer)


def test_the_issuer_fault_names_the_other_issuer_in_discovery_and_token(
    idp_alice: IdentityProvider,
) -> None:
    elsewhere = "http://elsewhere.example"
    idp_alice.directory.fault(issuer=elsewhere)
    assert _discovery(idp_alice)["issuer"] == elsewhere
    issued = _code_flow(idp_alice, "alice", issuer=elsewhere)
    assert issued.claims["iss"] == elsewhere
    with pytest.raises(jwt.InvalidIssuerError):
        _verified(idp_alice, issued.tokens["id_token"], issuer=idp_alice.issuer)
    idp_alice.directory.clear_faults()
    assert _discovery(idp_alice)["issuer"] == idp_alice.issuer


def test_an_unknown_fault_is_refused(idp: IdentityProvider) -> None:
    with pytest.raises(ValueError, match="unknown fault"):
        idp.directory.fault(audience="other")


def test_someone_removed_or_with_a_wrong_password_cannot_sign_in(
    idp_alice: IdentityProvider,
) -> None:
    state, nonce, verifier = "s", "n", secrets.token_urlsafe(32)
    url = _authorize_url(idp_alice, state=state, nonce=nonce, verifier=verifier)
    assert idp_alice.authorize(url, "alice").startswith(REDIRECT_URI + "?code=")
    # The IdP's own sign-in form refuses them, and says so.
    refused = "username and/or password you specified are not correct"
    with pytest.raises(SignInRefused, match=refused):
        idp_alice.authorize(url, "alice", "not-her-password")
    idp_alice.directory.remove("alice")
    with pytest.raises(SignInRefused, match=refused):
        idp_alice.authorize(url, "alice")
    with pytest.raises(SignInRefused, match=refused):
        idp_alice.authorize(url, "nobody")


def test_a_redirect_uri_the_client_does_not_have_is_refused(idp_alice: IdentityProvider) -> None:
    url = _authorize_url(idp_alice, state="s", nonce="n", verifier=secrets.token_urlsafe(32))
    with pytest.raises(SignInRefused):
        idp_alice.authorize(url.replace("localhost%3A9", "localhost%3A10"), "alice")
