"""The tests' OpenID Connect provider as fixtures (a plugin, in tests/conftest.py).

``identity_provider`` starts one IdP (``harness.oidc``) per xdist worker; ``idp`` hands it
to a test with the directory emptied and no faults.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.oidc import IdentityProvider, identity_provider_start


@pytest.fixture(scope="session")
def identity_provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IdentityProvider]:
    """One IdP per xdist worker (a session is a worker's), stopped at the end."""
    provider = identity_provider_start(tmp_path_factory.mktemp("idp"))
    try:
        yield provider
    finally:
        provider.stop()


@pytest.fixture
def idp(identity_provider: IdentityProvider) -> IdentityProvider:
    """The worker's IdP with nobody in its directory and no faults (its clients stay)."""
    identity_provider.directory.reset()
    return identity_provider
