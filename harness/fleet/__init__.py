"""Fleet clients: OS processes that drive Settle's host API over HTTP for a bounded time.

Used by ``bench/api.py`` (role ``lifecycle``), ``bench/client.py`` and
``tests/integration/test_fleet_soak.py`` (the mixed roles) through
``harness.fleet.run.fleet_run``, which starts the processes, releases them together and
collects what each wrote. A client runs as::

    python harness/fleet/process.py --url URL --name NAME --role ROLE --seconds S \\
        --go-file FILE --out FILE [--providers JSON] [--shared-dir DIR] [--index N]

with the host token in ``SETTLE_HOST_TOKEN`` and the approver token in
``SETTLE_APPROVER_TOKEN``. It prints ``ready`` (a JSON line, ``harness.processes.emit``),
waits for the go file, then loops until ``--seconds`` after the go file appeared. Its CPU
is counted from the first iteration of its loop (``cpu`` in the ``--out`` file), so that
a role's set-up is not charged to its requests.

Modules: ``api`` (one call through ``settle_client``, measured and judged), ``client``
(each endpoint and the steps the roles share), ``roles``, ``baselines`` (the lifecycle by
hand, for ``bench/client.py``), ``process`` (the client's ``main``) and ``run`` (the
parent's side).

Roles (``--providers`` is a JSON list of ``{kind, name, path, url, secret, lease_seconds}``):

``lifecycle``
    register, open the approval and dispatch (one request) → report committed where a
    policy approves the opening; else register and open → approve → dispatch → report
    committed. Unique keys, on the first provider, no effect performed: the benchmark's
    loop.
``lifecycle-sockets``
    ``lifecycle``'s requests on plain sockets, each recorded as ``lifecycle`` records it:
    ``bench/api.py --client sockets``, a load generator as cheap as a hand-written one.
``httpx``
    The same lifecycle written by hand on ``httpx.Client``, as a host engineer would
    without the library: the baseline ``bench/client.py`` holds the library to.
``sockets``
    The same lifecycle by hand on plain sockets, a fresh connection per request: the
    floor ``bench/client.py`` shows beside ``httpx`` and ``library``.
``library``
    The same lifecycle through ``settle_client.Host.run`` (``bench/client.py`` sets it
    against ``httpx`` and ``lifecycle`` in one run).
``steady``
    The same on each provider in turn, performing the effect at the provider, with a
    heartbeat; some report ``failed``, some are revoked before dispatch (which is then
    refused as ``revoked``), some after dispatch (``revoked: false``).
``racer``
    All racers drive the same key per time slot (``race-<n>``) on the first provider:
    register, open, approve, then dispatch or resume; the one that gets the fencing token
    performs the effect and reports. Racer 0 revokes every fifth key first; racer 1
    presents forged fencing tokens.
``crasher``
    Dispatches on the first provider (meant to have a 1 s lease) and "crashes": stops
    after the effect, or before it, or reports only after its lease lapsed, or resumes
    its own lapsed operation later as a fresh worker, polling until it is released.
    Crashed keys are published in ``--shared-dir`` for the resumer.
``callbacker``
    Dispatches on the first provider (an HTTP provider with a secret), performs the
    effect there and sends the provider's signed callbacks: matching, after a report,
    mismatching then matching, stale sequences, a wrong signature, a record of failure.
``resumer``
    Resumes the keys the crashers and callbackers published, once their lease has
    lapsed, and polls each while Settle answers ``in_progress`` (a background worker
    runs the lookup that resume queued), then resumes a released one once more.

Every role speaks through ``settle_client`` (``harness.fleet.api``): ``library`` through
``Host.run``, as a host would; the others one request at a time on the library's HTTP
layer, with nothing retried, as the soak test's judges of the server (each answer checked
against what the role expects there, forged tokens, lapsed leases on purpose), with
resumes of many keys interleaved in one process (``run_due``), which a blocking
``Host.run`` per key cannot do. ``httpx`` and ``sockets`` are the baselines written
without it (``harness.fleet.baselines``).

Resume never looks a provider up inside the request: after a lapsed lease it queues a
lookup for a Celery worker and answers ``in_progress`` with ``retry_after``. A client
that wants the outcome polls (``Client.resume_polled``): it waits ``retry_after``, at
most ``RESUME_WAIT`` seconds at a time, and asks at most ``RESUME_POLLS`` times; an
operation still ``in_progress`` after that is unexpected (no lookup ran).

Every answer is checked against what the role expects at that point; anything else is
listed under ``unexpected``. A 5xx, a body that is not a JSON object and a transport error
are never expected. The ``--out`` file (JSON, written at the end) holds every call as
``[endpoint, status, code, milliseconds, sql, transactions, cpu_ms]``
(``sql``/``transactions``/``cpu_ms`` from the ``X-Settle-SQL`` headers of
``bench/counting_wsgi.py``, else null), the fencing
tokens each key was handed, each key's provider and intended ending, ``resumes`` (how
many resumes were answered with each decision) and ``violations`` (a second effect
performed for one key).
"""
