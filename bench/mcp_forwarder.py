"""A bare HTTP forwarder: what one more HTTP hop costs a call, with nothing of MCP in it.

    python -m bench.mcp_forwarder --port PORT --upstream URL

Every request it receives goes to ``URL`` as it came (method, headers, body), and the
upstream's answer comes back as it went, streamed (an MCP server answers a call as an
event stream). It reads no JSON and keeps no session: an MCP client pointed at it talks
to the upstream through one extra hop, on the same server (uvicorn) and the same client
(httpx, keeping its connections) that ``settle-mcp`` runs on. ``bench/mcp_gateway.py
--forwarder`` times calls through it beside the gateway's passthrough: the least a
gateway that is an HTTP server and an HTTP client in Python adds on this machine.
Prints ``ready`` once listening.
"""

from __future__ import annotations

import argparse
from typing import Any

import httpx
import uvicorn

# Hop-by-hop, or recomputed by the next hop.
_DROPPED = {b"host", b"content-length", b"connection", b"transfer-encoding"}


def forwarder(upstream: str) -> Any:
    client = httpx.AsyncClient(timeout=30)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                print("ready", flush=True)
                await send({"type": "lifespan.startup.complete"})
            await client.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        headers = [(k, v) for k, v in scope["headers"] if k not in _DROPPED]
        request = client.build_request(scope["method"], upstream, headers=headers, content=body)
        answer = await client.send(request, stream=True)
        try:
            kept = [(k, v) for k, v in answer.headers.raw if k.lower() not in _DROPPED]
            await send(
                {"type": "http.response.start", "status": answer.status_code, "headers": kept}
            )
            async for chunk in answer.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            await answer.aclose()
        await send({"type": "http.response.body", "body": b""})

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    uvicorn.run(forwarder(args.upstream), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
