"""Provider adapters: read the provider's own record of an operation, and nothing else.

An adapter answers exactly one question -- "what does the provider say happened for this
operation key, and was it done with exactly these parameters?" -- and turns the answer into
a :class:`LookupResult` whose ``verdict`` is a ``recovery.models.Verdict`` value:

``match``
    The provider holds a consistent record for the key with the operation's params digest.
    This includes a record whose status is ``failed``: that is the provider's definitive
    "not performed", and deciding what it means is the caller's business.
``mismatch``
    A consistent record exists, but for different parameters.
``corrupt``
    Something is there but cannot be trusted (half a record, bad checksum or signature,
    unparsable data, a digest that does not match its own parameters, an unknown status).
``absent``
    The provider was readable and holds nothing for the key.
``unavailable``
    The provider could not be read (missing file, lock, timeout, 5xx, misconfiguration,
    any unexpected error). It says nothing about whether the effect happened.

Adapters never write to a provider: SQLite files are opened read-only with ``query_only``,
journals are opened for reading, HTTP providers only get ``GET``, MCP servers only a call
of the evidence tool the administrator named. ``evidence_lookup`` never
raises, because a lookup that crashes the caller is worse than one that says "unavailable".

One module per kind of provider record (``sqlite_orders``, ``journal``, ``http``, ``mcp``), the
verdict rules they share in ``base``; an adapter is registered here by its name, the
``adapter`` a provider is configured with.
"""

from __future__ import annotations

from collections.abc import Callable

from recovery.adapters.base import (
    ABSENT,
    CORRUPT,
    MATCH,
    MAX_DETAIL_LENGTH,
    MAX_RAW_TEXT,
    MAX_RECORD_BYTES,
    MAX_REFERENCE_LENGTH,
    MISMATCH,
    PROVIDER_STATUSES,
    SIGNATURE_HEADER,
    UNAVAILABLE,
    LookupMany,
    LookupResult,
    ProviderConfig,
    finished,
    unavailable,
)
from recovery.adapters.http import (
    HTTP_CONCURRENCY,
    http_lookup,
    http_lookup_many,
    signature_valid,
)
from recovery.adapters.journal import journal_lookup, journal_lookup_many
from recovery.adapters.mcp import mcp_lookup, mcp_server_parse
from recovery.adapters.sqlite_orders import SQLITE_BATCH, sqlite_lookup, sqlite_lookup_many

__all__ = [
    "ABSENT",
    "CORRUPT",
    "HTTP_CONCURRENCY",
    "MATCH",
    "MAX_DETAIL_LENGTH",
    "MAX_RAW_TEXT",
    "MAX_RECORD_BYTES",
    "MAX_REFERENCE_LENGTH",
    "MISMATCH",
    "PROVIDER_STATUSES",
    "SIGNATURE_HEADER",
    "SQLITE_BATCH",
    "UNAVAILABLE",
    "LookupResult",
    "ProviderConfig",
    "evidence_lookup",
    "evidence_lookup_many",
    "mcp_server_parse",
    "signature_valid",
]

# Each adapter by the name a provider is configured with: one key's lookup, and a batch's.
_ADAPTERS: dict[str, Callable[[ProviderConfig, str, str], LookupResult]] = {
    "sqlite": sqlite_lookup,
    "journal": journal_lookup,
    "http": http_lookup,
    "mcp": mcp_lookup,
}
# An MCP provider has no batch of its own: each key is one session, as a single lookup's.
_MANY_ADAPTERS: dict[str, LookupMany] = {
    "sqlite": sqlite_lookup_many,
    "journal": journal_lookup_many,
    "http": http_lookup_many,
}


def evidence_lookup(
    *, config: ProviderConfig, operation_key: str, params_digest: str
) -> LookupResult:
    """Look up the provider's evidence for ``operation_key``; never raises.

    Any unexpected exception becomes ``unavailable``: an adapter bug must not be mistaken
    for evidence either way, and the caller's retry/reconcile budget handles it.
    """
    adapter = _ADAPTERS.get(config.adapter)
    if adapter is None:
        result = unavailable(
            f"Unknown provider adapter {config.adapter!r}; nothing was looked up.",
            error="unknown_adapter",
        )
    else:
        try:
            result = adapter(config, operation_key, params_digest)
        except Exception as exc:  # the contract is "never raises"
            result = unavailable(
                f"The lookup failed unexpectedly ({type(exc).__name__}: {exc}).",
                error=f"{type(exc).__name__}: {exc}",
            )
    return finished(result)


def evidence_lookup_many(
    *, config: ProviderConfig, wanted: dict[str, str]
) -> dict[str, LookupResult]:
    """``evidence_lookup`` for many operations of one provider at once; never raises.

    ``wanted`` maps operation keys to params digests. A journal is read once, a SQLite
    database queried once per ``SQLITE_BATCH`` keys, an HTTP provider asked with at most
    ``HTTP_CONCURRENCY`` requests at a time. Each key's answer is judged by the same code
    as a single lookup's, so it is the answer ``evidence_lookup`` would give.
    """
    if not wanted:
        return {}
    many = _MANY_ADAPTERS.get(config.adapter)
    if many is None:
        return {
            key: evidence_lookup(config=config, operation_key=key, params_digest=digest)
            for key, digest in wanted.items()
        }
    try:
        found = many(config, wanted)
    except Exception as exc:  # the contract is "never raises"
        found = {
            key: unavailable(
                f"The lookup failed unexpectedly ({type(exc).__name__}: {exc}).",
                error=f"{type(exc).__name__}: {exc}",
            )
            for key in wanted
        }
    return {key: finished(found[key]) for key in wanted}
