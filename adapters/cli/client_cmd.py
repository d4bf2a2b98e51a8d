"""`apexps send` and `apexps listen`: an APEX application on the command line.

Port: RFC 3340 §8.3 registers apex-edge (the endpoint-relay service) as TCP 912, a privileged
port; apexps listens on the unprivileged `DEFAULT_APEX_PORT` 9120 (912 with a trailing zero)
unless told otherwise, so `--server HOST` means HOST:9120 and `--server HOST:912` reaches a
relay on the registered port.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from typing import Any

from adapters.apex.codec import Data
from adapters.cli import loop as event_loop
from adapters.cli.security import add_client_options, client_security
from adapters.client.client import ApexClient
from adapters.client.reconnect import ReconnectingApexClient, ReconnectPolicy

__all__ = ["APEX_EDGE_PORT", "DEFAULT_APEX_PORT", "FOREVER", "add_reconnect_option",
           "register"]

#: RFC 3340 §8.3: the well-known apex-edge port (needs privileges to listen on).
APEX_EDGE_PORT = 912
#: What apexps uses by default: unprivileged, recognisably derived from 912.
DEFAULT_APEX_PORT = 9120


def _server(text: str) -> tuple[str, int]:
    host, colon, port = text.rpartition(":")
    if not colon or host.endswith(":"):  # no port, or a bare IPv6 address
        return text.strip("[]"), DEFAULT_APEX_PORT
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST[:PORT]") from None


def content_fields(content: bytes) -> dict[str, str]:
    """A JSON line's view of content: `content` if it is UTF-8 text, else `content_base64`."""
    try:
        return {"content": content.decode("utf-8")}
    except UnicodeDecodeError:
        return {"content_base64": base64.b64encode(content).decode("ascii")}


def _as_json(data: Data) -> str:
    record: dict[str, Any] = {
        "originator": str(data.originator),
        "recipients": [str(r) for r in data.recipients],
        "content_type": data.content_type,
        **content_fields(data.content),
    }
    return json.dumps(record, ensure_ascii=False)


async def _send(args: argparse.Namespace) -> int:
    if args.file == "-":
        content = sys.stdin.buffer.read()
    else:
        with open(args.file, "rb") as f:
            content = f.read()
    client = await ApexClient.connect(*args.server, **client_security(args))
    try:
        await client.attach(args.endpoint)
        await client.send(args.endpoint, args.to, content, args.content_type)
    finally:
        await client.close()
    return 0


async def _listen(args: argparse.Namespace) -> int:
    client: ApexClient | ReconnectingApexClient
    if args.reconnect:
        client = await ReconnectingApexClient.connect(*args.server, policy=FOREVER,
                                                      **client_security(args))
    else:
        client = await ApexClient.connect(*args.server, **client_security(args))
    try:
        await client.attach(args.endpoint)
        print(f"apexps: attached as {args.endpoint}", file=sys.stderr, flush=True)
        seen = 0
        async for data in client.receive():
            print(_as_json(data), flush=True)
            seen += 1
            if args.count and seen >= args.count:
                break
    finally:
        await client.close()
    return 0


#: `--reconnect`: a listener on the command line waits for its relay as long as it takes.
FOREVER = ReconnectPolicy(max_attempts=None)


def add_reconnect_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reconnect", action="store_true",
                   help="if the connection is lost, dial again (backoff up to 30 s, forever)"
                        " and re-attach; data sent to us meanwhile is not replayed")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", type=_server, default=("127.0.0.1", DEFAULT_APEX_PORT),
                   metavar="HOST[:PORT]",
                   help=f"the APEX relay (default: 127.0.0.1:{DEFAULT_APEX_PORT}; RFC 3340's"
                        f" registered apex-edge port is {APEX_EDGE_PORT})")
    p.add_argument("--as", dest="endpoint", required=True, metavar="ENDPOINT",
                   help="the endpoint to attach as, e.g. fred@example.com")
    add_client_options(p)


def register(sub: Any) -> None:
    send = sub.add_parser("send", help="attach as an endpoint and send one data to others",
                          description="Attach to an APEX relay and send FILE (or stdin) as one"
                                      " data operation; exit 1 if the relay refuses it.")
    _common(send)
    send.add_argument("--to", action="append", required=True, metavar="ENDPOINT",
                      help="a recipient (repeat for several)")
    send.add_argument("--content-type", default="application/octet-stream", metavar="TYPE",
                      help="media type of the content (default: %(default)s)")
    send.add_argument("file", nargs="?", default="-", metavar="FILE|-",
                      help="what to send (default: stdin)")
    send.set_defaults(func=lambda args: event_loop.run(_send(args)))
    listen = sub.add_parser("listen", help="attach as an endpoint and print the data it gets",
                            description="Attach to an APEX relay and print one JSON line per"
                                        " data received, until Ctrl-C.")
    _common(listen)
    listen.add_argument("--count", type=int, default=0, metavar="N",
                        help="exit after this many data (default: run until Ctrl-C)")
    add_reconnect_option(listen)
    listen.set_defaults(func=lambda args: event_loop.run(_listen(args)))
