"""SASL mechanisms as pure objects: SASLprep, PLAIN, ANONYMOUS, SCRAM-SHA-256, the users file,
and the tuning profiles' XML."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.beep import (
    AnonymousServer,
    Blob,
    BlobStatus,
    Challenge,
    PlainClient,
    PlainServer,
    Proceed,
    Ready,
    RemoteProtocolError,
    ScramClient,
    ScramCredentials,
    ScramServer,
    Success,
    Users,
    parse_plain,
    parse_tuning,
    saslprep,
    serialize_tuning,
)
from adapters.beep._management import Error
from common.errors import (
    AccessDenied,
    ApexpsError,
    AuthenticationFailed,
    ConfigError,
    ParameterSyntaxError,
)

# --- SASLprep ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("given_", "expected"), [
    ("I\u00adX", "IX"), ("user", "user"), ("USER", "USER"), ("\u00aa", "a"), ("\u2168", "IX"),
])
def test_saslprep_rfc4013_examples(given_: str, expected: str) -> None:
    """RFC 4013 §3's examples 1-5."""
    assert saslprep(given_) == expected


@pytest.mark.parametrize("bad", ["\u0007", "\u0627\u0031"])
def test_saslprep_rfc4013_errors(bad: str) -> None:
    """RFC 4013 §3's examples 6 (prohibited) and 7 (bidi)."""
    with pytest.raises(ParameterSyntaxError):
        saslprep(bad)


@given(st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7e)))
def test_saslprep_leaves_printable_ascii_alone(text: str) -> None:
    """Printable ASCII is already prepared."""
    assert saslprep(text) == text


# --- PLAIN ------------------------------------------------------------------------------------


def test_plain_parses_the_three_fields() -> None:
    """authzid NUL authcid NUL passwd; the authzid may be empty."""
    assert parse_plain(b"\x00tim\x00tanstaaftanstaaf") == ("", "tim", "tanstaaftanstaaf")
    assert parse_plain(b"Ursel\x00Kurt\x00xipj3plmq") == ("Ursel", "Kurt", "xipj3plmq")


@pytest.mark.parametrize("bad", [
    b"", b"tim", b"\x00tim", b"\x00\x00pw", b"\x00tim\x00", b"a\x00b\x00c\x00d",
    b"\x00\xff\x00pw", b"\x00" + b"u" * 256 + b"\x00pw", b"\x00tim\x00" + b"p" * 1025,
    b"\x00t\x07m\x00pw",
])
def test_plain_refuses_malformed_messages(bad: bytes) -> None:
    """Anything but three sane fields is a 501."""
    with pytest.raises(ParameterSyntaxError):
        parse_plain(bad)


@given(st.binary(max_size=400))
def test_plain_parse_any_bytes_parses_or_raises_501(data: bytes) -> None:
    """Hostile bytes never escape as anything but ParameterSyntaxError."""
    try:
        _, authcid, password = parse_plain(data)
    except ParameterSyntaxError:
        return
    assert authcid and password and data.count(b"\x00") == 2


def test_plain_server_checks_password_and_authzid() -> None:
    """Right password: success as authcid; wrong: 535; acting as someone else: 537."""
    def verify(user: str, password: str) -> bool:
        return (user, password) == ("fred", "pw")

    assert PlainServer(verify).step(None) == Challenge(b"")
    assert PlainServer(verify).step(b"\x00fred\x00pw") == Success("fred")
    assert PlainServer(verify).step(b"fred\x00fred\x00pw") == Success("fred")
    with pytest.raises(AuthenticationFailed):
        PlainServer(verify).step(b"\x00fred\x00nope")
    with pytest.raises(AccessDenied):
        PlainServer(verify).step(b"barney\x00fred\x00pw")
    server = PlainServer(verify)
    server.step(b"\x00fred\x00pw")
    with pytest.raises(ParameterSyntaxError):
        server.step(b"\x00fred\x00pw")  # one response only


def test_plain_client_message() -> None:
    """The client sends everything up front."""
    assert PlainClient("fred", "pw").initial() == b"\x00fred\x00pw"
    assert PlainClient("fred", "pw", authzid="boss").initial() == b"boss\x00fred\x00pw"


def test_anonymous_trace() -> None:
    """ANONYMOUS takes an optional short printable trace token."""
    assert AnonymousServer().step(b"sirhc") == Success("anonymous")
    with pytest.raises(ParameterSyntaxError):
        AnonymousServer().step(b"x" * 256)
    with pytest.raises(ParameterSyntaxError):
        AnonymousServer().step(b"a\nb")


# --- SCRAM-SHA-256 ----------------------------------------------------------------------------

#: RFC 7677 §3, user "user", password "pencil".
RFC7677 = {
    "salt": "W22ZaJ0SNY7soEsUEjb6gQ==",
    "client_nonce": "rOprNGfwEbeRWgbNEkqO",
    "server_nonce": "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
    "client_first": b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO",
    "server_first": b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
    "client_final": b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
    "server_final": b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=",
}
PENCIL = ScramCredentials.derive("pencil", base64.b64decode(RFC7677["salt"]), 4096)


def _rfc_server() -> ScramServer:
    return ScramServer({"user": PENCIL}.get, nonce=lambda: str(RFC7677["server_nonce"]))


def test_scram_rfc7677_vector() -> None:
    """Client and server reproduce RFC 7677 §3's exchange octet for octet."""
    client = ScramClient("user", "pencil", nonce=lambda: str(RFC7677["client_nonce"]))
    server = _rfc_server()
    assert client.initial() == RFC7677["client_first"]
    assert server.step(client.initial()) == Challenge(bytes(RFC7677["server_first"]))  # type: ignore[arg-type]
    assert client.step(bytes(RFC7677["server_first"])) == RFC7677["client_final"]  # type: ignore[arg-type]
    outcome = server.step(bytes(RFC7677["client_final"]))  # type: ignore[arg-type]
    assert outcome == Success("user", bytes(RFC7677["server_final"]))  # type: ignore[arg-type]
    client.complete(outcome.data)


@settings(max_examples=40, deadline=None)
@given(position=st.integers(0, 200), flip=st.integers(1, 255))
def test_scram_rfc7677_any_tampered_final_fails(position: int, flip: int) -> None:
    """Changing any octet of the RFC's client-final message makes the server refuse it."""
    server = _rfc_server()
    server.step(bytes(RFC7677["client_first"]))  # type: ignore[arg-type]
    final = bytearray(RFC7677["client_final"])  # type: ignore[arg-type]
    final[position % len(final)] ^= flip
    with pytest.raises(ApexpsError) as caught:
        server.step(bytes(final))
    assert int(caught.value.code) in (501, 535)


@settings(max_examples=40, deadline=None)
@given(position=st.integers(0, 200), flip=st.integers(1, 255))
def test_scram_rfc7677_any_tampered_server_final_is_caught(position: int, flip: int) -> None:
    """Changing any octet of the server's signature makes the client refuse the success."""
    client = ScramClient("user", "pencil", nonce=lambda: str(RFC7677["client_nonce"]))
    client.step(bytes(RFC7677["server_first"]))  # type: ignore[arg-type]
    final = bytearray(RFC7677["server_final"])  # type: ignore[arg-type]
    final[position % len(final)] ^= flip
    with pytest.raises(ApexpsError):
        client.complete(bytes(final))


_NAMES = st.text(alphabet=st.characters(categories=("L", "N", "P", "S"),
                                        exclude_characters=":/"), min_size=1, max_size=20)


@settings(max_examples=25, deadline=None)
@given(user=_NAMES, password=st.text(alphabet=st.characters(categories=("L", "N", "P", "S")),
                                     min_size=1, max_size=30),
       wrong=st.booleans())
def test_scram_round_trip(user: str, password: str, wrong: bool) -> None:
    """Any user and password authenticate, and a wrong password never does."""
    users = Users()
    try:
        users.add(user, password, iterations=4096)
    except ConfigError:
        return  # names or passwords SASLprep refuses to store
    name = Users.check_name(user)
    server = ScramServer(users.scram_credentials)
    client = ScramClient(name, password + ("x" if wrong else ""))
    challenge = server.step(client.initial())
    assert isinstance(challenge, Challenge)
    final = client.step(challenge.data)
    if wrong:
        with pytest.raises(AuthenticationFailed):
            server.step(final)
        return
    outcome = server.step(final)
    assert outcome == Success(name, outcome.data)  # type: ignore[union-attr]
    client.complete(outcome.data)  # type: ignore[union-attr]
    assert users.verify(name, password)


@pytest.mark.parametrize("first", [
    b"p=tls-unique,,n=user,r=abcdefghij", b"x,,n=user,r=abcdefghij", b"n,,r=abc,n=user",
    b"n,,m=ext,n=user,r=abcdefghij", b"n,,n=us=er,r=abcdefghij", b"n,,n=user,r=a,b",
    b"n,,n=user,r=short", b"n,x=1,n=user,r=abcdefghij", b"n", b"\xff",
])
def test_scram_server_refuses_bad_client_first(first: bytes) -> None:
    """Channel binding, mandatory extensions, bad names and nonces: refused."""
    with pytest.raises(ApexpsError):
        _rfc_server().step(first)


def test_scram_client_refuses_hostile_server_first() -> None:
    """A nonce that does not extend ours, or an absurd iteration count: refused."""
    for server_first in (b"r=other,s=QUJD,i=4096", b"r=abcdefghijX,s=QUJD,i=99999999999",
                         b"r=abcdefghijX,s=QUJD,i=1", b"r=abcdefghijX,s=!!,i=4096"):
        with pytest.raises(ApexpsError):
            ScramClient("u", "p", nonce=lambda: "abcdefghij").step(server_first)


def test_scram_authzid_must_be_the_user() -> None:
    """Acting as someone else after a good proof: 537."""
    users = Users()
    users.add("fred", "pw", iterations=4096)
    server = ScramServer(users.scram_credentials)
    client = ScramClient("fred", "pw", authzid="barney")
    challenge = server.step(client.initial())
    assert isinstance(challenge, Challenge)
    with pytest.raises(AccessDenied):
        server.step(client.step(challenge.data))


# --- the users file ---------------------------------------------------------------------------


def test_users_file_round_trip_and_errors() -> None:
    """format() then parse() gives the same credentials; bad lines name their number."""
    users = Users()
    users.add("fred", "pw", iterations=4096, salt=b"0123456789abcdef")
    users.add("wilma@example.com", "pebbles", iterations=4096)
    again = Users.parse("# apexps users\n\n" + users.format())
    assert again.scram_credentials("fred") == users.scram_credentials("fred")
    assert again.verify("wilma@example.com", "pebbles")
    assert not again.verify("wilma@example.com", "bambam")
    assert not again.verify("nobody", "pw")
    line = users.format().splitlines()[0]
    for bad, number in ((f"{line}\n{line}\n", 2), ("fred\n", 1), ("fred:plain\n", 1),
                        ("# ok\nfr ed:" + line.partition(":")[2], 2)):
        with pytest.raises(ConfigError, match=f"line {number}"):
            Users.parse(bad)
    with pytest.raises(ConfigError):
        users.add("a:b", "pw")
    with pytest.raises(ConfigError):
        users.add("fred", "")
    with pytest.raises(ConfigError):
        ScramCredentials.derive("pw", b"salt", 1000)


# --- the tuning profiles' XML -----------------------------------------------------------------


@given(data=st.binary(max_size=600), status=st.sampled_from(BlobStatus))
def test_blob_round_trip(data: bytes, status: BlobStatus) -> None:
    """Any octets survive serialize_tuning -> parse_tuning."""
    assert parse_tuning(serialize_tuning(Blob(data, status))) == Blob(data, status)


def test_rfc_tuning_elements() -> None:
    """The RFC's own spellings parse, and ours match them."""
    assert parse_tuning(b"<ready />") == Ready()
    assert parse_tuning(b"<ready version='1.2' />") == Ready("1.2")
    assert parse_tuning(b"<proceed />") == Proceed()
    assert parse_tuning(b"<blob>AGJsb2NrbWFzdGVy</blob>") == Blob(b"\x00blockmaster")
    assert parse_tuning(b"<blob>b3RwLXNoYTEgOTk5NyBwaXh5bWlzYXM4NTgwNSBleHQ=\r\n   </blob>") \
        == Blob(b"otp-sha1 9997 pixymisas85805 ext")
    assert parse_tuning(b"<blob status='complete' />") == Blob(b"", BlobStatus.COMPLETE)
    assert parse_tuning(b"<error code='535' />") == Error(535)
    assert serialize_tuning(Blob(b"", BlobStatus.ABORT)) == b"<blob status='abort' />"
    assert serialize_tuning(Error(534, "too weak")) == b"<error code='534'>too weak</error>"


@pytest.mark.parametrize(("xml", "code"), [
    (b"<ready version='oops' />", 501), (b"<ready>x</ready>", 501), (b"<proceed a='1' />", 501),
    (b"<blob>***</blob>", 501), (b"<blob status='done' />", 501), (b"<start />", 501),
    (b"<blob xml:space='odd' />", 501), (b"<blob", 500), (b"<blob>" + b"QUJD" * 3000, 500),
    (b"<!DOCTYPE x><blob />", 500),
])
def test_bad_tuning_elements(xml: bytes, code: int) -> None:
    """Not well-formed is 500, not valid is 501; never terminating."""
    with pytest.raises(RemoteProtocolError) as caught:
        parse_tuning(xml)
    assert int(caught.value.code) == code and not caught.value.terminate


@given(st.binary(max_size=300))
def test_parse_tuning_any_bytes(data: bytes) -> None:
    """Arbitrary octets parse or raise RemoteProtocolError, nothing else."""
    try:
        parse_tuning(data)
    except RemoteProtocolError as exc:
        assert int(exc.code) in (500, 501)
