"""`message_content` and `apexps publish --message-id/--revision/--expires`: the headers a
publisher gives reach the broker's ingest as the draft's ps:message-content (§5.2.1)."""

from __future__ import annotations

import pytest

from adapters.cli.main import build_parser
from adapters.cli.pubsub_cmd import _envelope
from adapters.client.content import message_content
from broker.pubsub.ingest import ingest
from common.errors import ParameterSyntaxError

_AS = ["--server", "127.0.0.1:9", "--as", "quote@example.com"]


def _headers(content: bytes) -> tuple[str | None, str | None, str | None, list[str]]:
    got = ingest(content, "application/xml", topic="t", publisher="quote@example.com", now=1)
    return got.message_id, got.revision_id, got.expiration_date, got.fields["symbol"]


def test_envelope_carries_the_headers_to_ingest() -> None:
    body = b"<?xml version='1.0'?><equity-quote symbol='XMPL'/>"
    wrapped = message_content(body, message_id="1029", revision=2, expires="*")
    assert _headers(wrapped) == ("1029", "2", "*", ["XMPL"])


def test_envelope_escapes_its_headers() -> None:
    wrapped = message_content(b"<q symbol='A'/>", message_id="a<b&c")
    assert _headers(wrapped)[0] == "a<b&c"


@pytest.mark.parametrize("bad", [{"revision": -1}, {"revision": 2**31}, {"expires": "soon"}])
def test_envelope_refuses_bad_headers(bad: dict[str, object]) -> None:
    with pytest.raises(ParameterSyntaxError):
        message_content(b"<q/>", **bad)  # type: ignore[arg-type]


def test_publish_flags_wrap_each_message() -> None:
    args = build_parser().parse_args(
        ["publish", "--topic", "equity.quote.service", "--message-id", "1029", "--revision",
         "7", "--expires", "2030-01-01T00:00:00Z", *_AS, "q.xml"])
    wrap = _envelope(args)
    assert wrap is not None
    assert _headers(wrap(b"<q symbol='TEST'/>")) == ("1029", "7", "2030-01-01T00:00:00Z",
                                                     ["TEST"])


def test_publish_without_header_flags_sends_the_body_as_is() -> None:
    args = build_parser().parse_args(["publish", "--topic", "t", "--message-id", "IBM", *_AS])
    assert _envelope(args) is None


@pytest.mark.parametrize("flags", [["--revision", "-3"], ["--revision", "x"],
                                   ["--expires", "tomorrow"]])
def test_publish_refuses_bad_header_flags(flags: list[str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["publish", "--topic", "t", *flags, *_AS])
    assert "argument --" in capsys.readouterr().err
