"""One host opening one approval at an agreed moment, as one of many at once.

Run by the budget's concurrency test as ``python tests/procs/open_at.py URL KEY START``
with the host token in ``SETTLE_HOST_TOKEN``: waits until the wall clock reaches START
(seconds since the epoch), posts ``/api/v1/operations/KEY/approvals`` and prints the
answer's status code and JSON body on one line. No Django: a host is only HTTP.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request


def main() -> int:
    url, key, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
    request = urllib.request.Request(
        f"{url}/api/v1/operations/{key}/approvals",
        data=b"{}",
        method="POST",
        headers={
            "Authorization": f"Bearer {os.environ['SETTLE_HOST_TOKEN']}",
            "Content-Type": "application/json",
        },
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    time.sleep(max(0.0, start - time.time()))
    try:
        with opener.open(request, timeout=60) as answer:
            status, body = answer.status, answer.read()
    except urllib.error.HTTPError as refused:
        status, body = refused.code, refused.read()
    print(json.dumps({"status": status, "body": json.loads(body)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
