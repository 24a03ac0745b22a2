"""The tests' OpenID Connect provider, a real one: ``harness.idp`` in a process of its own.

Settle's sign-in tests talk to it as Settle will talk to a company's IdP: discovery, the
authorization endpoint a browser is sent to, the token, JWKS and userinfo endpoints. Its
endpoints are never mocked; what a test changes is the directory file the IdP reads at
every request (who may sign in, their groups, the faults of the next ID tokens)::

    def test_sign_in(idp: IdentityProvider) -> None:
        idp.client(client_id="settle", secret="s3cret", redirect_uris=[callback])
        idp.directory.person("alice", groups=["settle-operators"])
        response = client.post("/accounts/oidc/…/login/")   # Settle sends the browser off
        back = idp.authorize(response["Location"], "alice")  # the browser at the IdP
        client.get(back)                                      # Settle's callback

``identity_provider_start`` starts one (free port, temporary folder, a minute at most to
come up); the suite's fixtures are in tests/support/oidc.py, the benchmarks start their own.
Loopback only: no network, no PostgreSQL or Redis; its database is a SQLite file of its own.
"""

from __future__ import annotations

import contextlib
import html.parser
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from harness.accounts import PASSWORD
from harness.celery_procs import REPO_ROOT
from harness.idp.directory import (
    CLIENTS_FILE,
    DIRECTORY_FILE,
    FAULTS,
    empty,
    json_read,
    json_write,
)
from harness.processes import process_stop
from harness.providers import _free_port

# Where allauth's sign-in page is at the IdP (harness/idp/urls.py).
LOGIN_PATH = "/accounts/login/"


class SignInRefused(Exception):
    """The IdP did not send the browser back to the client: a refused sign-in (the form
    came back), or an error page of the authorization endpoint."""

    def __init__(self, message: str, response: httpx.Response) -> None:
        said = _page_says(response.text)
        super().__init__(f"{message}: {response.status_code} at {response.url}: {said}")
        self.response = response


def _page_says(page: str) -> str:
    """The form's errors if the page has any, else its title: why the IdP stopped."""
    found = re.search(r'class="errorlist[^"]*">(.*?)</ul>', page, re.S) or re.search(
        r"<title>(.*?)</title>", page, re.S
    )
    return " ".join(re.sub(r"<[^>]+>", " ", found.group(1)).split()) if found else ""


class Directory:
    """The people of the IdP and the faults of its next ID tokens, as a test sets them.

    Every change rewrites the directory file whole (harness/idp/directory.py has
    its format); the IdP's next request sees it.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._data = empty()
        self._write()

    def _write(self) -> None:
        json_write(self.path, self._data)

    def reset(self) -> None:
        """Nobody, the claim ``groups``, no faults: what each test starts from."""
        self._data = empty()
        self._write()

    def person(
        self,
        username: str,
        *,
        groups: list[str],
        email: str | None = None,
        password: str = PASSWORD,
        email_verified: bool = True,
        sub: str | None = None,
        name: str | None = None,
    ) -> None:
        """Add (or replace) someone who may sign in with ``username`` and ``password``.

        ``email`` defaults to ``<username>@example.com`` and ``name`` to the username
        capitalised. ``sub`` defaults to the IdP's user id for the username, created at
        their first sign-in and the same for the IdP's life (allauth's own ``sub``).
        """
        self._data["people"][username] = {
            "password": password,
            "email": email if email is not None else f"{username}@example.com",
            "email_verified": email_verified,
            "name": name if name is not None else username.capitalize(),
            "groups": list(groups),
            "sub": sub,
        }
        self._write()

    def groups(self, username: str, groups: list[str]) -> None:
        """Replace the groups of someone already in the directory."""
        self._data["people"][username]["groups"] = list(groups)
        self._write()

    def remove(self, username: str) -> None:
        """They can no longer sign in, and a session they had at the IdP no longer counts."""
        del self._data["people"][username]
        self._write()

    def groups_claim(self, name: str) -> None:
        """The claim (ID token and userinfo) that carries the groups; ``groups`` by default."""
        self._data["groups_claim"] = name
        self._write()

    def fault(self, **faults: Any) -> None:
        """Faults of every ID token from now on, until :meth:`clear_faults`.

        ``nonce="wrong"``: the token's nonce is not the one the authorization request sent.
        ``expired=True``: its ``exp`` lies an hour in the past (``iat`` before it).
        ``issuer="http://elsewhere.example"``: discovery's ``issuer`` and the tokens'
        ``iss`` both name that issuer instead of :attr:`IdentityProvider.issuer`.
        Faults add up: a second call adds to (or changes) those of the first.
        """
        unknown = set(faults) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown fault(s) {sorted(unknown)}; known: {FAULTS}")
        if "nonce" in faults and faults["nonce"] != "wrong":
            raise ValueError('the nonce fault is nonce="wrong"')
        self._data["faults"].update(faults)
        self._write()

    def clear_faults(self) -> None:
        self._data["faults"] = {}
        self._write()


class _Forms(html.parser.HTMLParser):
    """The forms of a page: each one's action and the inputs it would send as they are."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = {key: value or "" for key, value in attrs}
        if tag == "form":
            self.forms.append((named.get("action", ""), {}))
        elif tag == "input" and self.forms and named.get("name"):
            self.forms[-1][1][named["name"]] = named.get("value", "")


def _sign_in_form(page: str) -> tuple[str, dict[str, str]] | None:
    parser = _Forms()
    parser.feed(page)
    return next(((action, fields) for action, fields in parser.forms if "password" in fields), None)


class IdentityProvider:
    """A running IdP (harness/idp), and what a test does with it."""

    def __init__(self, process: subprocess.Popen[bytes], url: str, state: Path, log: Path) -> None:
        self.process = process
        # Where it answers; also the issuer it names, unless a test set the issuer fault.
        self.url = url
        self.issuer = url
        self.state = state
        self.log_path = log
        self.directory = Directory(state / DIRECTORY_FILE)

    @property
    def discovery_url(self) -> str:
        return f"{self.url}/.well-known/openid-configuration"

    def client(self, *, client_id: str, secret: str, redirect_uris: list[str]) -> None:
        """Create (or update) a confidential client of the code flow: scopes openid,
        profile and email, consent skipped. The IdP's next request knows it (it syncs the
        clients file into its database, harness/idp/middleware.py)."""
        path = self.state / CLIENTS_FILE
        clients = json_read(path, {})
        clients[client_id] = {"secret": secret, "redirect_uris": list(redirect_uris)}
        json_write(path, clients)

    def _here(self, url: httpx.URL) -> bool:
        ours = httpx.URL(self.url)
        return (url.scheme, url.host, url.port) == (ours.scheme, ours.host, ours.port)

    def authorize(self, authorize_url: str, username: str, password: str = PASSWORD) -> str:
        """What a browser does at the IdP, from ``authorize_url`` (where the client sent
        it) to the IdP's redirect back to the client; returns that redirect's URL (the
        callback with ``code`` and ``state``, or ``error``) without following it.

        Signs in at the IdP's form as ``username``, with a browser of its own (fresh
        cookies: every call signs in). Raises :class:`SignInRefused` if the IdP shows a
        page instead of sending the browser back (wrong password, someone not in the
        directory, a request the authorization endpoint rejects).
        """
        signed_in = False
        # trust_env=False: a local server, never through a proxy from the environment.
        with httpx.Client(trust_env=False, timeout=10.0) as browser:
            response = browser.get(authorize_url)
            for _step in range(10):
                if response.is_redirect:
                    location = response.url.join(response.headers["Location"])
                    if not self._here(location):
                        return str(location)
                    response = browser.get(location)
                    continue
                form = _sign_in_form(response.text) if response.status_code == 200 else None
                if form is None or signed_in or response.url.path != LOGIN_PATH:
                    raise SignInRefused("the IdP did not send the browser back", response)
                action, fields = form
                fields.update(login=username, password=password)
                response = browser.post(response.url.join(action or response.url), data=fields)
                signed_in = True
            raise SignInRefused("the IdP redirected too many times", response)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL to its process group if it is not gone in ``timeout``."""
        process_stop(self.process, timeout)


def _key_write(path: Path) -> None:
    """A fresh RSA key for the IdP to sign its ID tokens with (``IDP_OIDC_PRIVATE_KEY``)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, trust_env=False, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def identity_provider_start(state: Path, startup_timeout: float = 60.0) -> IdentityProvider:
    """Start the IdP with ``state`` as its folder; return once discovery answers.

    Its output (requests, tracebacks) goes to ``state/idp.log``. Raises RuntimeError,
    naming that log, if it does not answer within ``startup_timeout`` seconds; a failed
    start leaves no process behind.
    """
    state.mkdir(parents=True, exist_ok=True)
    _key_write(state / "key.pem")
    log_path = state / "idp.log"
    deadline = time.monotonic() + startup_timeout
    for _attempt in range(3):
        port = _free_port()
        # Bound on 127.0.0.1, named by localhost: WebAuthn in Settle's browser tests
        # wants localhost, and the issuer must be the name Settle is configured with.
        url = f"http://localhost:{port}"
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "harness.idp.settings",
            "IDP_STATE_DIR": str(state),
            "IDP_ISSUER": url,
            "PYTHONUNBUFFERED": "1",
        }
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "harness.idp.serve", f"127.0.0.1:{port}"],
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        provider = IdentityProvider(process, url, state, log_path)
        while time.monotonic() < deadline and process.poll() is None:
            if _answers(provider.discovery_url):
                return provider
            time.sleep(0.1)
        provider.stop()
        if time.monotonic() >= deadline:
            break
        # It exited early (most likely the port was taken meanwhile): try another port.
    tail = ""
    with contextlib.suppress(OSError):
        tail = log_path.read_text("utf-8", "replace")[-3000:]
    raise RuntimeError(
        f"the identity provider did not answer within {startup_timeout:.0f}s; "
        f"its log: {log_path}; its end:\n{tail}"
    )
