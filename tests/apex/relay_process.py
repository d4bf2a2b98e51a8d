"""An `ApexServer` for `example.com` in a process of its own, for tests that kill it with SIGKILL
and start it again on the same port.

Run: `python -m tests.apex.relay_process PORT` (0: any free port). It prints `port N` once it
listens, then one line per data its services take, and serves until stdin closes. Services:

* `apex=taker`: prints `took CONTENT` and never answers, so the sender's `send` stays in flight;
* `apex=counter`: prints `counted CONTENT` and answers at once.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterable

from adapters.apex import Data, Endpoint, Relay
from adapters.apex.server import ApexServer
from adapters.cli import logs


class _Printer:
    def __init__(self, verb: str, answer: bool) -> None:
        self.verb, self.answer = verb, answer

    def on_data(self, data: Data, recipient: Endpoint) -> Iterable[Data] | asyncio.Future[
            Iterable[Data]]:
        print(self.verb, data.content.decode(), flush=True)
        if self.answer:
            return ()
        return asyncio.get_running_loop().create_future()  # never resolved


async def _main(port: int) -> None:
    relay = Relay("example.com")
    relay.register_service("apex=taker", _Printer("took", answer=False))
    relay.register_service("apex=counter", _Printer("counted", answer=True))
    async with ApexServer(relay, "127.0.0.1", port) as server:
        print("port", server.port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


if __name__ == "__main__":
    logs.configure("warning")  # to stderr: stdout is the test's
    asyncio.run(_main(int(sys.argv[1])))
