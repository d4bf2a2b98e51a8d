"""The TLS and SASL tuning profiles over a `ConnectionPair`: flows, refusals and hostile input."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.beep import (
    BEEP_XML,
    TLS_PROFILE,
    AuthState,
    BeepConnection,
    ChannelStarted,
    ChannelStartRefused,
    ChannelStartRequested,
    ErrorReplyReceived,
    Event,
    GreetingReceived,
    LocalProtocolError,
    PlainClient,
    Profile,
    ProtocolViolation,
    Role,
    SaslAuthenticated,
    SaslFailed,
    ScramClient,
    TlsProceed,
    TlsRefused,
    TlsRequested,
    TlsState,
    Tuning,
    TuningPolicy,
    Users,
)
from common.errors import ConfigError

from .helpers import APEX

PLAIN = "http://iana.org/beep/SASL/PLAIN"
SCRAM = "http://iana.org/beep/SASL/SCRAM-SHA-256"
ANON = "http://iana.org/beep/SASL/ANONYMOUS"

USERS = Users()
USERS.add("fred", "wilma's secret", iterations=4096)


class TunedPair:
    """An initiator and a listener, each with its `Tuning`, wired back to back."""

    def __init__(self, policy: TuningPolicy) -> None:
        self.i = Tuning(BeepConnection(Role.INITIATOR))
        self.l = Tuning(BeepConnection(Role.LISTENER, profiles=[APEX]), policy)
        self.l.send_greeting()
        self.i.send_greeting()
        self.got_i, self.got_l = self.pump()

    def pump(self) -> tuple[list[Event], list[Event]]:
        got_i: list[Event] = []
        got_l: list[Event] = []
        while True:
            to_l, to_i = self.i.conn.data_to_send(), self.l.conn.data_to_send()
            if not to_l and not to_i:
                return got_i, got_l
            if to_l:
                got_l += self.l.receive_data(to_l)
            if to_i:
                got_i += self.i.receive_data(to_i)

    def secure(self) -> None:
        """TLS as the shells do it, with the handshake itself left out."""
        channel = self.i.start_tls()
        _, got_l = self.pump()
        assert got_l == [TlsRequested(channel, "1")]
        assert self.l.accept_tls(channel)
        to_i = self.l.conn.data_to_send()
        assert self.l.begin_tls() == b""
        assert self.i.receive_data(to_i) == [TlsProceed(channel)]
        assert self.i.conn.data_to_send() == b""  # nothing after ready (§3.1.3.1)
        assert self.i.begin_tls() == b""
        self.l.tls_established()
        self.i.tls_established()
        got_i, _ = self.pump()
        assert isinstance(got_i[0], GreetingReceived)
        self.greeting = got_i[0]

    def authenticate(self, mechanism: PlainClient | ScramClient
                     ) -> tuple[list[Event], list[Event]]:
        self.i.authenticate(mechanism)
        return self.pump()


def _policy(**kw: object) -> TuningPolicy:
    base: dict[str, object] = {"tls": True, "users": USERS}
    base.update(kw)
    return TuningPolicy(**base)  # type: ignore[arg-type]


def test_greetings_follow_the_state() -> None:
    """Before TLS: SCRAM, APEX, TLS; after: SCRAM, PLAIN, APEX -- PLAIN only under TLS."""
    pair = TunedPair(_policy())
    assert pair.got_i == [GreetingReceived((SCRAM, APEX, TLS_PROFILE))]
    pair.secure()
    assert pair.greeting == GreetingReceived((SCRAM, PLAIN, APEX))
    assert pair.i.secured and pair.l.secured
    assert pair.l.conn.channels == {0: ""}


def test_require_tls_offers_only_tls_and_refuses_apex() -> None:
    """With require_tls the first greeting lists only TLS, and an APEX start gets 550."""
    pair = TunedPair(_policy(require_tls=True))
    assert pair.got_i == [GreetingReceived((TLS_PROFILE,))]
    channel = pair.i.conn.start_channel([APEX])
    got_i, got_l = pair.pump()
    assert got_l == []
    assert isinstance(got_i[0], ChannelStartRefused) and got_i[0].code == 550
    assert pair.l.conn.channels == {0: ""}
    pair.secure()
    pair.i.conn.start_channel([APEX], number=channel)
    assert pair.pump()[1] == [ChannelStartRequested(channel, (Profile(APEX),), None)]


def test_plain_before_tls_is_refused_538() -> None:
    """PLAIN before TLS: the start is refused with 538 and nothing changes."""
    pair = TunedPair(_policy())
    got_i, got_l = pair.authenticate(PlainClient("fred", "wilma's secret"))
    assert got_i == [SaslFailed(1, 538, "PLAIN sends the password in the clear: start TLS"
                                        " first", "PLAIN")]
    assert got_l == []
    assert pair.l.auth_state is AuthState.NONE and pair.l.failures == 0
    assert pair.l.conn.channels == {0: ""}


def test_plain_after_tls_authenticates() -> None:
    """TLS, then PLAIN: both ends learn the identity; a second attempt is refused 550."""
    pair = TunedPair(_policy())
    pair.secure()
    got_i, got_l = pair.authenticate(PlainClient("fred", "wilma's secret"))
    assert got_l == [SaslAuthenticated(1, "fred", "PLAIN")]
    assert got_i == [SaslAuthenticated(1, "fred", "PLAIN")]
    assert pair.l.identity == "fred" and pair.l.auth_state is AuthState.AUTHENTICATED
    pair.i.conn.start_channel([Profile(SCRAM)])
    got_i, _ = pair.pump()
    assert isinstance(got_i[0], ChannelStartRefused) and got_i[0].code == 550
    assert pair.l.identity == "fred"


def test_wrong_password_fails_535_and_counts() -> None:
    """A wrong password: 535 inside the profile reply; after three failures, 454."""
    pair = TunedPair(_policy())
    pair.secure()
    for attempt in range(3):
        got_i, got_l = pair.authenticate(PlainClient("fred", "guess"))
        assert [type(e) for e in got_i] == [SaslFailed]
        assert isinstance(got_l[0], SaslFailed) and got_l[0].code == 535
        assert got_l[0].user == "fred"
        assert pair.l.failures == attempt + 1
    got_i, _ = pair.authenticate(PlainClient("fred", "wilma's secret"))
    assert isinstance(got_i[0], SaslFailed) and got_i[0].code == 454
    assert pair.l.identity is None


def test_scram_without_tls_authenticates() -> None:
    """SCRAM-SHA-256 needs no TLS: a challenge, a proof, and the server's signature."""
    pair = TunedPair(_policy())
    got_i, got_l = pair.authenticate(ScramClient("fred", "wilma's secret"))
    assert got_i == got_l == [SaslAuthenticated(1, "fred", "SCRAM-SHA-256")]
    channel = pair.i.conn.start_channel([Profile(TLS_PROFILE, "<ready />")])
    got_i, got_l = pair.pump()
    assert got_l == []  # §4.1: no TLS after SASL succeeded
    assert isinstance(got_i[0], ChannelStartRefused) and got_i[0].channel == channel


def test_scram_wrong_password_and_unknown_user_look_the_same() -> None:
    """A wrong password and an unknown user both fail with 535 at the proof."""
    texts = []
    for user, password in (("fred", "nope"), ("barney", "nope")):
        pair = TunedPair(_policy())
        got_i, got_l = pair.authenticate(ScramClient(user, password))
        assert isinstance(got_l[0], SaslFailed) and got_l[0].code == 535
        assert isinstance(got_i[0], SaslFailed) and got_i[0].code == 535
        texts.append(got_i[0].text)
    assert texts[0] == texts[1]


def test_require_auth_refuses_apex_with_530_until_authenticated() -> None:
    """require_auth: APEX before SASL is refused 530; after it, the start reaches the shell."""
    pair = TunedPair(_policy(require_auth=True))
    pair.i.conn.start_channel([APEX])
    got_i, got_l = pair.pump()
    assert got_l == [] and isinstance(got_i[0], ChannelStartRefused)
    assert got_i[0].code == 530
    pair.authenticate(ScramClient("fred", "wilma's secret"))
    number = pair.i.conn.start_channel([APEX])
    assert pair.pump()[1] == [ChannelStartRequested(number, (Profile(APEX),), None)]


def test_piggybacked_bad_ready_is_answered_501_in_the_profile() -> None:
    """§3.1.1's example: a bad version gets a positive reply carrying error 501."""
    pair = TunedPair(_policy())
    pair.i.conn.start_channel([Profile(TLS_PROFILE, '<ready version="oops" />')])
    got_i, got_l = pair.pump()
    assert isinstance(got_l[0], ProtocolViolation) and got_l[0].code == 501
    assert not got_l[0].terminate
    started = got_i[0]
    assert isinstance(started, ChannelStarted)
    assert "<error code='501'>version attribute" in started.profile.content
    assert pair.l.tls_state is TlsState.PLAIN


def test_ready_in_a_msg_on_the_tls_channel() -> None:
    """A TLS channel started empty, then `ready` in a MSG: answered RPY `proceed`."""
    pair = TunedPair(_policy())
    channel = pair.i.conn.start_channel([Profile(TLS_PROFILE)])
    pair.pump()
    pair.i.conn.send_msg(channel, b"<ready />", BEEP_XML)
    _, got_l = pair.pump()
    assert got_l == [TlsRequested(channel, "1")]
    assert pair.l.accept_tls(channel)
    assert b"RPY 1 0 . 0" in pair.l.conn.data_to_send()
    assert pair.l.must_begin_tls


def test_traffic_after_ready_terminates() -> None:
    """§3.1.3.1: a peer that sends anything after `ready` before our answer is cut off."""
    pair = TunedPair(_policy())
    pair.i.conn.start_channel([Profile(TLS_PROFILE, "<ready />")])
    pair.i.conn.start_channel([APEX])
    _, got_l = pair.pump()
    assert isinstance(got_l[0], TlsRequested)
    assert isinstance(got_l[1], ProtocolViolation) and got_l[1].terminate


def test_pending_replies_decline_tls_with_450() -> None:
    """A reply still owed when `ready` is processed: TLS is declined 450, nothing resets."""
    pair = TunedPair(_policy())
    pair.i.conn.start_channel([APEX])
    _, (requested,) = pair.pump()
    assert isinstance(requested, ChannelStartRequested)
    pair.l.conn.accept_start(requested.channel, APEX)
    pair.pump()
    pair.i.conn.send_msg(requested.channel, b"unanswered")
    channel = pair.i.start_tls()
    _, got_l = pair.pump()
    assert isinstance(got_l[-1], TlsRequested)
    assert not pair.l.accept_tls(channel)
    got_i, _ = pair.pump()
    assert got_i == [TlsRefused(channel, 450, "replies to earlier messages are still pending;"
                                              " try again")]
    assert pair.l.tls_state is TlsState.PLAIN and pair.i.tls_state is TlsState.PLAIN
    assert requested.channel in pair.l.conn.channels


def test_tuning_commands_out_of_order_change_nothing() -> None:
    """begin_tls without proceed, accept_tls without ready, start_tls twice: refused."""
    pair = TunedPair(_policy())
    with pytest.raises(LocalProtocolError):
        pair.l.begin_tls()
    with pytest.raises(LocalProtocolError):
        pair.l.accept_tls(1)
    with pytest.raises(LocalProtocolError):
        pair.l.start_tls()
    pair.i.start_tls()
    with pytest.raises(LocalProtocolError):
        pair.i.start_tls()
    with pytest.raises(LocalProtocolError):
        pair.i.authenticate(ScramClient("fred", "x"))
    assert pair.l.tls_state is TlsState.PLAIN and pair.i.tls_state is TlsState.REQUESTED


def test_blob_on_a_finished_exchange_gets_550() -> None:
    """After success, a stray blob on the SASL channel is answered ERR 550; identity stays."""
    pair = TunedPair(_policy())
    pair.authenticate(ScramClient("fred", "wilma's secret"))
    pair.i.conn.send_msg(1, b"<blob>AAAA</blob>", BEEP_XML)
    got_l = pair.l.receive_data(pair.i.conn.data_to_send())
    assert got_l == []
    assert b"<error code='550'>no authentication exchange" in pair.l.conn.data_to_send()
    assert pair.l.identity == "fred" and pair.l.auth_state is AuthState.AUTHENTICATED


def test_client_abort_gets_451() -> None:
    """`<blob status='abort' />` mid-exchange: ERR 451, the exchange is over, no failure counted."""
    pair = TunedPair(_policy())
    pair.i.conn.start_channel([Profile(SCRAM, "<blob>" + base64.b64encode(
        b"n,,n=fred,r=abcdefghijkl").decode() + "</blob>")])
    pair.pump()
    pair.i.conn.send_msg(1, b"<blob status='abort' />", BEEP_XML)
    _, got_l = pair.pump()
    assert isinstance(got_l[0], SaslFailed) and got_l[0].code == 451
    assert pair.l.auth_state is AuthState.NONE and pair.l.failures == 0


def _scram_channel() -> TunedPair:
    pair = TunedPair(_policy())
    first = base64.b64encode(b"n,,n=fred,r=abcdefghijkl").decode()
    pair.i.conn.start_channel([Profile(SCRAM, f"<blob>{first}</blob>")])
    pair.pump()
    assert pair.l.auth_state is AuthState.IN_PROGRESS
    return pair


HOSTILE_BLOBS = [
    (b"<blob>not base64!</blob>", 501),
    (b"<blob status='maybe' />", 501),
    (b"<blob status='complete' />", 501),
    (b"<blob><x /></blob>", 501),
    (b"<ready />", 501),
    (b"<!DOCTYPE blob [<!ENTITY a 'b'>]><blob>&a;</blob>", 500),
    (b"<blob>", 500),
    (b"<blob>" + b"A" * 9000 + b"</blob>", 500),
]


@pytest.mark.parametrize(("body", "code"), HOSTILE_BLOBS)
def test_hostile_blob_gets_error_and_changes_nothing(body: bytes, code: int) -> None:
    """A malformed blob mid-exchange: ERR with the RFC code; the exchange goes on unchanged."""
    pair = _scram_channel()
    pair.i.conn.send_msg(1, body, BEEP_XML)
    got_i, got_l = pair.pump()
    assert isinstance(got_l[0], ProtocolViolation) and got_l[0].code == code
    assert isinstance(got_i[0], ErrorReplyReceived)
    assert got_i[0].body.startswith(f"<error code='{code}'>".encode())
    assert pair.l.auth_state is AuthState.IN_PROGRESS and pair.l.failures == 0


@settings(max_examples=150, deadline=None)
@given(body=st.binary(max_size=300) | st.text(max_size=200).map(
    lambda t: f"<blob>{t}</blob>".encode("utf-8", "surrogatepass")))
def test_any_blob_body_is_answered_and_never_raises(body: bytes) -> None:
    """Whatever arrives on a SASL channel, the listener answers and stays unauthenticated."""
    pair = _scram_channel()
    pair.i.conn.send_msg(1, body, BEEP_XML)
    pair.l.receive_data(pair.i.conn.data_to_send())
    assert pair.l.conn.data_to_send().startswith((b"ERR 1 0", b"RPY 1 0"))
    assert pair.l.identity is None


@settings(max_examples=100, deadline=None)
@given(content=st.text(max_size=300), mech=st.sampled_from([PLAIN, SCRAM, ANON, TLS_PROFILE]))
def test_any_piggybacked_content_never_raises(content: str, mech: str) -> None:
    """Any piggybacked content for a tuning profile is answered; nobody gets authenticated."""
    pair = TunedPair(_policy())
    try:
        profile = Profile(mech, content)
    except LocalProtocolError:
        return
    pair.i.conn.start_channel([profile])
    pair.l.receive_data(pair.i.conn.data_to_send())
    answered = pair.l.conn.data_to_send().startswith((b"RPY 0 1", b"ERR 0 1"))
    assert answered or pair.l.tls_state is TlsState.REQUESTED
    assert pair.l.identity is None


def test_policy_validation() -> None:
    """Contradictory policies are refused at construction."""
    with pytest.raises(ConfigError):
        TuningPolicy(require_tls=True)
    with pytest.raises(ConfigError):
        TuningPolicy(require_auth=True)
    with pytest.raises(ConfigError):
        TuningPolicy(users=lambda u, p: True, mechanisms=("SCRAM-SHA-256",))
    with pytest.raises(ConfigError):
        TuningPolicy(mechanisms=("OTP",))
    assert TuningPolicy(users=lambda u, p: True).offered == ("PLAIN",)
    assert TuningPolicy(users=USERS).offered == ("SCRAM-SHA-256", "PLAIN")


def test_anonymous_does_not_satisfy_require_auth() -> None:
    """ANONYMOUS succeeds but APEX still needs a named user under require_auth."""
    from adapters.beep import AnonymousClient

    pair = TunedPair(_policy(require_auth=True,
                             mechanisms=("SCRAM-SHA-256", "ANONYMOUS")))
    got_i, _ = pair.authenticate(AnonymousClient("fred@example.com"))  # type: ignore[arg-type]
    assert got_i == [SaslAuthenticated(1, "anonymous", "ANONYMOUS")]
    pair.i.conn.start_channel([APEX])
    got_i, _ = pair.pump()
    assert isinstance(got_i[0], ChannelStartRefused) and got_i[0].code == 530


COMMANDS = ["start_tls", "accept_tls", "handshake", "scram", "scram_bad", "plain", "plain_bad",
            "apex", "garbage"]


@settings(max_examples=60, deadline=None)
@given(commands=st.lists(st.sampled_from(COMMANDS), max_size=12),
       require_tls=st.booleans(), require_auth=st.booleans())
def test_random_command_walks_keep_the_invariants(commands: list[str], require_tls: bool,
                                                  require_auth: bool) -> None:
    """Any order of tuning commands either works or is refused cleanly, and: nobody is
    authenticated without the right password, PLAIN never succeeds in plain, and APEX opens
    only when the policy allows."""
    pair = TunedPair(_policy(require_tls=require_tls, require_auth=require_auth))
    events: list[Event] = []
    requested = 1
    for command in commands:
        try:
            if command == "start_tls":
                pair.i.start_tls()
            elif command == "accept_tls":
                pair.l.accept_tls(requested)
            elif command == "handshake":
                for side in (pair.l, pair.i):
                    if side.must_begin_tls:
                        side.begin_tls()
                for side in (pair.l, pair.i):
                    if side.tls_state is TlsState.NEGOTIATING:
                        side.tls_established()
            elif command in ("scram", "scram_bad"):
                pair.i.authenticate(ScramClient("fred", "wilma's secret"
                                                if command == "scram" else "guess"))
            elif command in ("plain", "plain_bad"):
                pair.i.authenticate(PlainClient("fred", "wilma's secret"
                                                if command == "plain" else "guess"))
            elif command == "apex":
                pair.i.conn.start_channel([APEX])
            else:
                pair.i.conn.send_msg(1, b"<blob>!!</blob>", BEEP_XML)
        except LocalProtocolError:
            continue
        _, got_l = pair.pump()
        events += got_l
        requested = next((e.channel for e in got_l if isinstance(e, TlsRequested)), requested)
        if any(isinstance(e, ProtocolViolation) and e.terminate for e in got_l):
            return
    for event in events:
        if isinstance(event, SaslAuthenticated):
            assert event.identity == "fred"
            assert event.mechanism != "PLAIN" or pair.l.secured
        if isinstance(event, ChannelStartRequested):
            assert not require_tls or pair.l.secured
            assert not require_auth or pair.l.identity == "fred"
    if pair.l.identity is not None:
        assert pair.l.auth_state is AuthState.AUTHENTICATED
