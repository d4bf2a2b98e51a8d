"""`SlowApp`: an APEX application over real TCP that answers the relay's data only when the test
says so (ApexClient answers `ok` at once, which leaves dataTiming's deadlines untestable)."""

from __future__ import annotations

import asyncio
import contextlib

from adapters.apex.codec import (
    APEX_PROFILE,
    Attach,
    Data,
    Error,
    Ok,
    decode,
    encode,
    encode_xml,
)
from adapters.apex.endpoint import Endpoint
from adapters.beep import (
    BeepConnection,
    ChannelStarted,
    Event,
    GreetingReceived,
    MessageReceived,
    Profile,
    Role,
    SessionClosed,
)

TIMEOUT = 20.0


class SlowApp:
    """Attached as one endpoint (piggybacked attach); `next()` gives each delivered data with
    its MSG, `ok(msg)` / `error(msg)` answer it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._conn = BeepConnection(Role.INITIATOR)
        self._events: asyncio.Queue[Event | None] = asyncio.Queue()
        self._inbox: asyncio.Queue[tuple[MessageReceived, Data] | None] = asyncio.Queue()
        self._task = asyncio.create_task(self._read())

    @classmethod
    async def attach(cls, port: int, endpoint: Endpoint) -> SlowApp:
        app = cls(*await asyncio.open_connection("127.0.0.1", port))
        app._conn.send_greeting()
        app._flush()
        await app._expect(GreetingReceived)
        app._conn.start_channel([Profile(APEX_PROFILE, encode_xml(Attach(endpoint, 1)))])
        app._flush()
        started = await app._expect(ChannelStarted)
        assert isinstance(started, ChannelStarted)
        assert decode("application/beep+xml", started.profile.content.encode()) == Ok()
        return app

    async def _expect(self, kind: type[Event]) -> Event:
        while True:
            event = await asyncio.wait_for(self._events.get(), TIMEOUT)
            assert event is not None, "the relay ended the session"
            if isinstance(event, kind):
                return event

    def _flush(self) -> None:
        data = self._conn.data_to_send()
        if data:
            self._writer.write(data)

    async def _read(self) -> None:
        try:
            while data := await self._reader.read(65536):
                for event in self._conn.receive_data(data):
                    if isinstance(event, MessageReceived):
                        operation = decode(event.content_type, event.body)
                        assert isinstance(operation, Data)
                        self._inbox.put_nowait((event, operation))
                    else:
                        self._events.put_nowait(event)
                self._flush()
        except ConnectionError:
            pass
        finally:
            self._inbox.put_nowait(None)
            self._events.put_nowait(None)

    async def next(self) -> tuple[MessageReceived, Data]:
        got = await asyncio.wait_for(self._inbox.get(), TIMEOUT)
        assert got is not None, "the relay ended the session"
        return got

    def ok(self, msg: MessageReceived) -> None:
        content_type, body = encode(Ok())
        self._conn.send_rpy(msg.channel, msg.msgno, body, content_type)
        self._flush()

    def error(self, msg: MessageReceived, code: int = 550) -> None:
        content_type, body = encode(Error(code, "not now"))
        self._conn.send_err(msg.channel, msg.msgno, body, content_type)
        self._flush()

    async def close(self) -> None:
        """Release the session (channel-zero close, RFC 3080 §2.3.1.3), then hang up."""
        self._conn.close_session()
        self._flush()
        await self._expect(SessionClosed)
        await self.drop()

    async def drop(self) -> None:
        """Hang up without a word (a crashed application)."""
        self._writer.close()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
