"""A Server-Sent Events reader over aiohttp's client, for the gateway's tests and benchmark:
the parsing rules of the HTML standard's event stream (id, event, data, comments), enough of
them to check what a browser's EventSource would see."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import aiohttp


@dataclass(frozen=True, slots=True)
class Event:
    id: int | None
    event: str
    data: dict[str, Any]


class SseReader:
    """Events of one open SSE response; `comments` counts comment lines (heartbeats)."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.comments = 0

    async def next(self) -> Event | None:
        """The next event, or None at the end of the stream."""
        ident: int | None = None
        kind, data = "message", []
        while True:
            raw = await self.response.content.readline()
            if not raw:
                return None
            line = raw.decode().rstrip("\r\n")
            if line == "":
                if data:
                    return Event(ident, kind, json.loads("\n".join(data)))
                continue
            if line.startswith(":"):
                self.comments += 1
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "id":
                ident = int(value) if value else None  # empty: the last id is cleared
            elif name == "event":
                kind = value
            elif name == "data":
                data.append(value)

    def close(self) -> None:
        self.response.close()
