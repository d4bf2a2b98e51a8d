"""TLS and SASL over real loopback TCP: ApexServer and ApexClient with certificates made here."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable

import pytest
import trustme

from adapters.apex.relay import Relay
from adapters.apex.server import ApexServer
from adapters.beep import Users
from adapters.client.client import ApexClient
from common.errors import (
    AccessDenied,
    ApexpsError,
    AuthenticationFailed,
    AuthenticationRequired,
    EncryptionRequired,
    NotTaken,
    ServiceNotAvailable,
)

USERS = Users()
USERS.add("fred", "yabba dabba doo", iterations=4096)
USERS.add("barney", "betty", iterations=4096)


@pytest.fixture(scope="module", name="ca")
def _ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(name="server_tls")
def _server_tls(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost", "127.0.0.1").configure_cert(context)
    return context


@pytest.fixture(name="client_tls")
def _client_tls(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 60))


def test_tls_then_attach_and_data(server_tls: ssl.SSLContext,
                                  client_tls: ssl.SSLContext) -> None:
    """TLS is negotiated on the same connection, then APEX attach and data work over it."""
    async def body() -> None:
        async with ApexServer(Relay("example.com"), tls=server_tls, require_tls=True) as server:
            fred = await ApexClient.connect("127.0.0.1", server.port, tls=client_tls)
            barney = await ApexClient.connect("127.0.0.1", server.port, tls=client_tls,
                                              server_hostname="localhost")
            assert fred._wire.transport.get_extra_info("ssl_object") is not None
            await fred.attach("fred@example.com")
            await barney.attach("barney@example.com")
            await fred.send("fred@example.com", ["barney@example.com"], b"over TLS")
            got = await asyncio.wait_for(anext(barney.receive()), 10)
            assert got.content == b"over TLS"
            await fred.close()
            await barney.close()
    run(body)


def test_untrusted_certificate_fails_clearly(server_tls: ssl.SSLContext) -> None:
    """A client that does not trust the relay's certificate gets 421 naming the reason."""
    async def body() -> None:
        async with ApexServer(Relay("example.com"), tls=server_tls) as server:
            with pytest.raises(ServiceNotAvailable, match=r"TLS handshake with 127\.0\.0\.1"
                                                          r" failed.*certificate verify failed"):
                await ApexClient.connect("127.0.0.1", server.port,
                                         tls=ssl.create_default_context())
            # The relay survives and still serves plain clients (TLS is not required).
            plain = await ApexClient.connect("127.0.0.1", server.port)
            await plain.attach("fred@example.com")
            await plain.close()
    run(body)


def test_require_tls_refuses_apex_before_tls(server_tls: ssl.SSLContext) -> None:
    """With require_tls, a client that skips TLS cannot start an APEX channel (550)."""
    async def body() -> None:
        async with ApexServer(Relay("example.com"), tls=server_tls, require_tls=True) as server:
            with pytest.raises(NotTaken, match="requires transport security"):
                await ApexClient.connect("127.0.0.1", server.port)
    run(body)


def test_no_tls_offered(client_tls: ssl.SSLContext) -> None:
    """Asking a relay without a certificate for TLS fails before anything is sent."""
    async def body() -> None:
        async with ApexServer(Relay("example.com")) as server:
            with pytest.raises(NotTaken, match="does not offer TLS"):
                await ApexClient.connect("127.0.0.1", server.port, tls=client_tls)
    run(body)


def test_plain_over_tls_success_and_failure(server_tls: ssl.SSLContext,
                                            client_tls: ssl.SSLContext) -> None:
    """PLAIN under TLS: the right password attaches, a wrong one raises 535."""
    async def body() -> None:
        async with ApexServer(Relay("example.com"), tls=server_tls, sasl=USERS,
                              require_auth=True) as server:
            fred = await ApexClient.connect("127.0.0.1", server.port, tls=client_tls,
                                            sasl=("fred", "yabba dabba doo"))
            await fred.attach("fred@example.com")
            await fred.close()
            with pytest.raises(AuthenticationFailed):
                await ApexClient.connect("127.0.0.1", server.port, tls=client_tls,
                                         sasl=("fred", "wrong"))
            with pytest.raises(AuthenticationFailed):
                await ApexClient.connect("127.0.0.1", server.port, tls=client_tls,
                                         sasl=("wilma", "whoever"))
    run(body)


def test_plain_without_tls_is_refused(server_tls: ssl.SSLContext) -> None:
    """PLAIN is not offered before TLS: the client says so (538) without sending a password."""
    async def body() -> None:
        async with ApexServer(Relay("example.com"), tls=server_tls, sasl=USERS) as server:
            with pytest.raises(EncryptionRequired):
                await ApexClient.connect("127.0.0.1", server.port, sasl=("fred", "x"))
    run(body)


def test_scram_without_tls_and_identity_bound_attach() -> None:
    """SCRAM authenticates in plain; fred may attach as fred and fred/sub, not barney (537)."""
    async def body() -> None:
        async with ApexServer(Relay("example.com"), sasl=USERS, require_auth=True) as server:
            fred = await ApexClient.connect("127.0.0.1", server.port, mechanism="SCRAM-SHA-256",
                                            sasl=("fred", "yabba dabba doo"))
            await fred.attach("fred@example.com")
            await fred.attach("fred/appl=wb@example.com")
            with pytest.raises(AccessDenied):
                await fred.attach("barney@example.com")
            with pytest.raises(AccessDenied):
                await fred.attach("apex=pubsub@example.com")
            with pytest.raises(AccessDenied):
                await fred.send("barney@example.com", ["fred@example.com"], b"forged")
            barney = await ApexClient.connect("127.0.0.1", server.port,
                                              mechanism="SCRAM-SHA-256",
                                              sasl=("barney", "betty"))
            await barney.attach("barney@example.com")
            await fred.send("fred@example.com", ["barney@example.com"], b"hi barney")
            got = await asyncio.wait_for(anext(barney.receive()), 10)
            assert (str(got.originator), got.content) == ("fred@example.com", b"hi barney")
            await fred.close()
            await barney.close()
    run(body)


def test_require_auth_refuses_apex_before_sasl() -> None:
    """With require_auth, an unauthenticated APEX start is refused with 530."""
    async def body() -> None:
        async with ApexServer(Relay("example.com"), sasl=USERS, require_auth=True) as server:
            with pytest.raises(AuthenticationRequired):
                await ApexClient.connect("127.0.0.1", server.port)
    run(body)


def test_plain_verifier_callable(server_tls: ssl.SSLContext,
                                 client_tls: ssl.SSLContext) -> None:
    """A bare verify(user, password) callable serves PLAIN under TLS, and nothing else."""
    seen: list[tuple[str, str]] = []

    def verify(user: str, password: str) -> bool:
        seen.append((user, password))
        return password == "open sesame"

    async def body() -> None:
        async with ApexServer(Relay("example.com"), tls=server_tls, sasl=verify) as server:
            with pytest.raises(ApexpsError, match="offers: none"):
                await ApexClient.connect("127.0.0.1", server.port, mechanism="SCRAM-SHA-256",
                                         sasl=("ali", "open sesame"))
            ali = await ApexClient.connect("127.0.0.1", server.port, tls=client_tls,
                                           sasl=("ali", "open sesame"))
            await ali.attach("ali/cave@example.com")
            with pytest.raises(AccessDenied):
                await ali.attach("baba@example.com")
            await ali.close()
    run(body)
    assert seen == [("ali", "open sesame")]
