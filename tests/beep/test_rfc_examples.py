"""RFC 3080 example exchanges replayed byte for byte, fed whole and one byte at a time.

The transcripts are copied from the RFC. Where an example is a fragment whose sequence numbers
presuppose earlier traffic the RFC does not show, the test supplies that traffic (e.g. a greeting
of the size the seqno implies) and says so.
"""

from __future__ import annotations

import pytest

from adapters.beep import (
    AnswerReceived,
    AnswersComplete,
    BeepConnection,
    ChannelClosed,
    ChannelStarted,
    ChannelStartRequested,
    CloseRefused,
    CloseRequested,
    GreetingReceived,
    GreetingRefused,
    Profile,
    Role,
    SessionClosed,
    SessionState,
)

from .helpers import ANONYMOUS, APEX, OTP, PLAIN, TLS, feed, rfc

GREETING_110 = """
    L: RPY 0 0 . 0 110
    L: Content-Type: application/beep+xml
    L:
    L: <greeting>
    L:    <profile uri='http://iana.org/beep/TLS' />
    L: </greeting>
    L: END
    I: RPY 0 0 . 0 52
    I: Content-Type: application/beep+xml
    I:
    I: <greeting />
    I: END
"""

GREETING_221 = """
    L: RPY 0 0 . 0 221
    L: Content-Type: application/beep+xml
    L:
    L: <greeting>
    L:    <profile uri='http://iana.org/beep/SASL/ANONYMOUS' />
    L:    <profile uri='http://iana.org/beep/SASL/OTP' />
    L:    <profile uri='http://iana.org/beep/APEX' />
    L: </greeting>
    L: END
    I: RPY 0 0 . 0 52
    I: Content-Type: application/beep+xml
    I:
    I: <greeting />
    I: END
"""


@pytest.fixture(params=[False, True], ids=["whole", "bytewise"])
def bytewise(request: pytest.FixtureRequest) -> bool:
    """Run each script fed whole, then one byte at a time."""
    return bool(request.param)


def greet(listener_profiles: list[str], script: str, bytewise: bool
          ) -> tuple[BeepConnection, BeepConnection]:
    """Both sides send their greetings; assert the exact bytes and the events."""
    listener = BeepConnection(Role.LISTENER, profiles=listener_profiles)
    initiator = BeepConnection(Role.INITIATOR)
    listener.send_greeting()
    initiator.send_greeting()
    l_bytes, i_bytes = listener.data_to_send(), initiator.data_to_send()
    assert l_bytes == rfc(script, "L")
    assert i_bytes == rfc(script, "I")
    assert feed(initiator, l_bytes, bytewise) == [GreetingReceived(tuple(listener_profiles))]
    assert feed(listener, i_bytes, bytewise) == [GreetingReceived(())]
    assert listener.state is initiator.state is SessionState.OPEN
    return listener, initiator


def test_greeting_2_3_1_1(bytewise: bool) -> None:
    """§2.3.1.1/§2.4: the listener advertises TLS, the initiator nothing; both are then OPEN."""
    greet([TLS], GREETING_110, bytewise)


def test_unavailable_listener_2_4(bytewise: bool) -> None:
    """§2.4: an unavailable listener answers with error 421 and both sides terminate."""
    script = """
        L: ERR 0 0 . 0 60
        L: Content-Type: application/beep+xml
        L:
        L: <error code='421' />
        L: END
        I: RPY 0 0 . 0 52
        I: Content-Type: application/beep+xml
        I:
        I: <greeting />
        I: END
    """
    listener, initiator = BeepConnection(Role.LISTENER), BeepConnection(Role.INITIATOR)
    listener.refuse_session(421)
    initiator.send_greeting()
    assert listener.data_to_send() == rfc(script, "L")
    assert initiator.data_to_send() == rfc(script, "I")
    assert feed(initiator, rfc(script, "L"), bytewise) == [GreetingRefused(421, "")]
    assert initiator.state is listener.state is SessionState.TERMINATED
    # "the greeting sent by the BEEP peer acting in the initiating role is ignored"
    assert feed(listener, rfc(script, "I"), bytewise) == []


def test_start_accepted_2_3_1_2(bytewise: bool) -> None:
    """§2.3.1.2: a start offering OTP then ANONYMOUS is answered with the OTP profile."""
    script = """
        C: MSG 0 1 . 52 178
        C: Content-Type: application/beep+xml
        C:
        C: <start number='1'>
        C:    <profile uri='http://iana.org/beep/SASL/OTP' />
        C:    <profile uri='http://iana.org/beep/SASL/ANONYMOUS' />
        C: </start>
        C: END
        S: RPY 0 1 . 221 87
        S: Content-Type: application/beep+xml
        S:
        S: <profile uri='http://iana.org/beep/SASL/OTP' />
        S: END
    """
    # The server's seqno 221 is that of the 221-octet greeting of §3.
    listener, initiator = greet([ANONYMOUS, OTP, APEX], GREETING_221, bytewise)
    assert initiator.start_channel([OTP, ANONYMOUS]) == 1
    assert initiator.data_to_send() == rfc(script, "C")
    assert feed(listener, rfc(script, "C"), bytewise) == [
        ChannelStartRequested(1, (Profile(OTP), Profile(ANONYMOUS)), None)]
    listener.accept_start(1, OTP)
    assert listener.data_to_send() == rfc(script, "S")
    assert feed(initiator, rfc(script, "S"), bytewise) == [ChannelStarted(1, Profile(OTP))]
    assert initiator.channels == listener.channels == {0: "", 1: OTP}


def test_start_refused_for_parity_2_3_1_2(bytewise: bool) -> None:
    """§2.3.1.2: an initiator asking for even channel 2 gets error 501, byte for byte."""
    script = """
        C: MSG 0 1 . 52 120
        C: Content-Type: application/beep+xml
        C:
        C: <start number='2'>
        C:    <profile uri='http://iana.org/beep/SASL/OTP' />
        C: </start>
        C: END
        S: ERR 0 1 . 221 127
        S: Content-Type: application/beep+xml
        S:
        S: <error code='501'>number attribute
        S: in &lt;start&gt; element must be odd-valued</error>
        S: END
    """
    listener, _ = greet([ANONYMOUS, OTP, APEX], GREETING_221, bytewise)
    assert feed(listener, rfc(script, "C"), bytewise) == []  # judged without the application
    assert listener.data_to_send() == rfc(script, "S")
    assert listener.state is SessionState.OPEN


def test_start_refused_unsupported_2_3_1_5(bytewise: bool) -> None:
    """§2.3.1.5: a start naming only an unsupported profile gets error 550, byte for byte."""
    script = """
        I: MSG 0 1 . 52 115
        I: Content-Type: application/beep+xml
        I:
        I: <start number='2'>
        I:    <profile uri='http://iana.org/beep/FOO' />
        I: </start>
        I: END
        L: ERR 0 1 . 221 105
        L: Content-Type: application/beep+xml
        L:
        L: <error code='550'>all requested profiles are
        L: unsupported</error>
        L: END
    """
    listener, _ = greet([ANONYMOUS, OTP, APEX], GREETING_221, bytewise)
    assert feed(listener, rfc(script, "I"), bytewise) == []
    assert listener.data_to_send() == rfc(script, "L")


TLS_EXCHANGE = """
    I: MSG 0 1 . 52 158
    I: Content-Type: application/beep+xml
    I:
    I: <start number='1'>
    I:    <profile uri='http://iana.org/beep/TLS'>
    I:        <![CDATA[<ready />]]>
    I:    </profile>
    I: </start>
    I: END
    L: RPY 0 1 . {seq} 121
    L: Content-Type: application/beep+xml
    L:
    L: <profile uri='http://iana.org/beep/TLS'>
    L:     <![CDATA[<proceed />]]>
    L: </profile>
    L: END
"""


@pytest.mark.parametrize(
    ("first", "after"),
    [([TLS], [ANONYMOUS, OTP, APEX]), ([ANONYMOUS, OTP, APEX, TLS], [ANONYMOUS, OTP, APEX, TLS])],
    ids=["tls-then-sasl", "failed-negotiation"],
)
def test_tls_tuning_and_new_greetings_3(bytewise: bool, first: list[str], after: list[str]
                                        ) -> None:
    """§3: piggybacked ready/proceed, a tuning reset, then fresh greetings from seqno 0."""
    greetings = {1: GREETING_110, 3: GREETING_221}.get(len(first))
    listener = BeepConnection(Role.LISTENER, profiles=first)
    initiator = BeepConnection(Role.INITIATOR)
    listener.send_greeting()
    initiator.send_greeting()
    l_greeting = listener.data_to_send()
    if greetings is not None:
        assert l_greeting == rfc(greetings, "L")
    assert l_greeting.startswith(f"RPY 0 0 . 0 {110 if len(first) == 1 else 268}\r\n".encode())
    feed(initiator, l_greeting, bytewise)
    feed(listener, initiator.data_to_send(), bytewise)
    script = TLS_EXCHANGE.format(seq=110 if len(first) == 1 else 268)
    initiator.start_channel([Profile(TLS, "<ready />")])
    assert initiator.data_to_send() == rfc(script, "I")
    assert feed(listener, rfc(script, "I"), bytewise) == [
        ChannelStartRequested(1, (Profile(TLS, "<ready />"),), None)]
    listener.accept_start(1, Profile(TLS, "<proceed />"))
    assert listener.data_to_send() == rfc(script, "L")
    assert feed(initiator, rfc(script, "L"), bytewise) == [
        ChannelStarted(1, Profile(TLS, "<proceed />"))]
    # ... transport security negotiation happens here, outside BEEP ...
    assert listener.reset_after_tuning() == b""
    assert initiator.reset_after_tuning() == b""
    assert listener.channels == initiator.channels == {0: ""}
    listener.profiles = tuple(after)
    listener.send_greeting()
    initiator.send_greeting()
    l_again = listener.data_to_send()
    if len(after) == 3:
        assert l_again == rfc(GREETING_221, "L")
    else:
        assert l_again == l_greeting
    assert initiator.data_to_send() == rfc(GREETING_221, "I")
    assert feed(initiator, l_again, bytewise) == [GreetingReceived(tuple(after))]


CLOSE_REQUEST = """
    C: MSG 0 2 . 235 71
    C: Content-Type: application/beep+xml
    C:
    C: <close number='1' code='200' />
    C: END
"""


def _channel_one_with_rfc_seqnos(bytewise: bool) -> tuple[BeepConnection, BeepConnection]:
    # §2.3.1.3's seqnos (235 and 392) presuppose a start and a reply of 183 and 171 octets
    # after greetings of 52 and 221 octets: a SASL start carrying initialization data fits.
    listener, initiator = greet([ANONYMOUS, OTP, APEX], GREETING_221, bytewise)
    initiator.start_channel([Profile(OTP, "x" * 29)])
    assert feed(listener, initiator.data_to_send(), bytewise)
    listener.accept_start(1, Profile(OTP, "y" * 56))
    assert feed(initiator, listener.data_to_send(), bytewise) == [
        ChannelStarted(1, Profile(OTP, "y" * 56))]
    return listener, initiator


def test_close_channel_accepted_2_3_1_3(bytewise: bool) -> None:
    """§2.3.1.3: close of channel 1 with code 200, answered with ok, byte for byte."""
    reply = """
        S: RPY 0 2 . 392 46
        S: Content-Type: application/beep+xml
        S:
        S: <ok />
        S: END
    """
    listener, initiator = _channel_one_with_rfc_seqnos(bytewise)
    initiator.close_channel(1)
    assert initiator.data_to_send() == rfc(CLOSE_REQUEST, "C")
    assert feed(listener, rfc(CLOSE_REQUEST, "C"), bytewise) == [CloseRequested(1, 200, "")]
    listener.accept_close(1)
    assert listener.data_to_send() == rfc(reply, "S")
    assert feed(initiator, rfc(reply, "S"), bytewise) == [ChannelClosed(1)]
    assert initiator.channels == listener.channels == {0: ""}


def test_close_channel_declined_2_3_1_3(bytewise: bool) -> None:
    """§2.3.1.3: a declined close is answered with error 550 "still working", byte for byte."""
    reply = """
        S: ERR 0 2 . 392 79
        S: Content-Type: application/beep+xml
        S:
        S: <error code='550'>still working</error>
        S: END
    """
    listener, initiator = _channel_one_with_rfc_seqnos(bytewise)
    initiator.close_channel(1)
    feed(listener, initiator.data_to_send(), bytewise)
    listener.decline_close(1)
    assert listener.data_to_send() == rfc(reply, "S")
    assert feed(initiator, rfc(reply, "S"), bytewise) == [CloseRefused(1, 550, "still working")]
    still_open = initiator.channels
    assert still_open.keys() >= {1}  # a declined close leaves the channel open on both sides


RELEASE = """
    C: MSG 0 1 . 52 60
    C: Content-Type: application/beep+xml
    C:
    C: <close code='200' />
    C: END
"""


def _session_for_release(bytewise: bool) -> tuple[BeepConnection, BeepConnection]:
    # §2.4's seqno 264 is a greeting of 264 octets: TLS, two SASL mechanisms and APEX make one.
    listener = BeepConnection(Role.LISTENER, profiles=[TLS, OTP, PLAIN, APEX])
    initiator = BeepConnection(Role.INITIATOR)
    listener.send_greeting()
    initiator.send_greeting()
    l_greeting = listener.data_to_send()
    assert l_greeting.startswith(b"RPY 0 0 . 0 264\r\n")
    feed(initiator, l_greeting, bytewise)
    feed(listener, initiator.data_to_send(), bytewise)
    return listener, initiator


def test_session_release_2_4(bytewise: bool) -> None:
    """§2.4: close with number zero releases the session once answered with ok."""
    reply = """
        S: RPY 0 1 . 264 46
        S: Content-Type: application/beep+xml
        S:
        S: <ok />
        S: END
    """
    listener, initiator = _session_for_release(bytewise)
    initiator.close_session()
    assert initiator.data_to_send() == rfc(RELEASE, "C")
    assert initiator.state is SessionState.CLOSING
    assert feed(listener, rfc(RELEASE, "C"), bytewise) == [CloseRequested(0, 200, "")]
    listener.accept_close(0)
    assert listener.data_to_send() == rfc(reply, "S")
    assert listener.state is SessionState.CLOSED
    assert feed(initiator, rfc(reply, "S"), bytewise) == [SessionClosed(clean=True)]
    assert initiator.state is SessionState.CLOSED


def test_session_release_declined_2_4(bytewise: bool) -> None:
    """§2.4: a declined release leaves the session open."""
    reply = """
        S: ERR 0 1 . 264 79
        S: Content-Type: application/beep+xml
        S:
        S: <error code='550'>still working</error>
        S: END
    """
    listener, initiator = _session_for_release(bytewise)
    initiator.close_session()
    feed(listener, initiator.data_to_send(), bytewise)
    listener.decline_close(0)
    assert listener.data_to_send() == rfc(reply, "S")
    assert feed(initiator, rfc(reply, "S"), bytewise) == [CloseRefused(0, 550, "still working")]
    assert initiator.state is listener.state is SessionState.OPEN


def test_peer_to_peer_starts_2_7(bytewise: bool) -> None:
    """§2.7: both peers send "MSG 0 1"; the message numbers are unrelated, both channels open."""
    script = """
        I: MSG 0 1 . 52 120
        I: Content-Type: application/beep+xml
        I:
        I: <start number='1'>
        I:    <profile uri='http://iana.org/beep/SASL/OTP' />
        I: </start>
        I: END
        L: MSG 0 1 . 221 116
        L: Content-Type: application/beep+xml
        L:
        L: <start number='2'>
        L:    <profile uri='http://iana.org/beep/APEX' />
        L: </start>
        L: END
    """
    listener, initiator = greet([ANONYMOUS, OTP, APEX], GREETING_221, bytewise)
    initiator.start_channel([OTP])
    listener.start_channel([APEX])
    assert initiator.data_to_send() == rfc(script, "I")
    assert listener.data_to_send() == rfc(script, "L")
    assert feed(listener, rfc(script, "I"), bytewise) == [
        ChannelStartRequested(1, (Profile(OTP),), None)]
    assert feed(initiator, rfc(script, "L"), bytewise) == [
        ChannelStartRequested(2, (Profile(APEX),), None)]


def test_interleaved_answers_2_2_1_1(bytewise: bool) -> None:
    """§2.2.1.1: two ANS messages interleaved on channel 1 are collated by answer number."""
    answers = (b"ANS 1 0 * 0 20 0\r\n\r\n" + b"a" * 18 + b"END\r\n"
               b"ANS 1 0 * 20 20 1\r\n\r\n" + b"b" * 18 + b"END\r\n"
               b"ANS 1 0 . 40 10 0\r\n" + b"A" * 10 + b"END\r\n"
               b"ANS 1 0 . 50 3 1\r\nBBBEND\r\n"
               b"NUL 1 0 . 53 0\r\nEND\r\n")
    listener, initiator = greet([ANONYMOUS, OTP, APEX], GREETING_221, bytewise)
    initiator.start_channel([APEX])
    feed(listener, initiator.data_to_send(), bytewise)
    listener.accept_start(1, APEX)
    feed(initiator, listener.data_to_send(), bytewise)
    assert initiator.send_msg(1, b"subscribe") == 0
    assert initiator.data_to_send() == b"MSG 1 0 . 0 11\r\n\r\nsubscribeEND\r\n"
    octets = "application/octet-stream"
    assert feed(initiator, answers, bytewise) == [
        AnswerReceived(1, 0, 0, octets, b"a" * 18 + b"A" * 10),
        AnswerReceived(1, 0, 1, octets, b"b" * 18 + b"BBB"),
        AnswersComplete(1, 0),
    ]
