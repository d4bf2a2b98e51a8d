"""What a relay does with RFC 3342's data options at each step of RFC 3340 §4.4.4.1, without I/O.

Theory of operation
-------------------
The relay calls these at the two places the RFC names:

* step 5.2, right before data goes to the next relay: `next_relay_hop` spends one of
  dataHopping's hops and takes the local processing time off dataTiming's noLaterThan and
  reportAfter. It returns the data to send (options rewritten) or None when it must not be sent,
  and the reports the step produced;
* step 5.3, delivery to an attached application: `watch_delivery` turns dataTiming into a
  `Watch` -- deadlines the shell times from the moment it sends the MSG, and the reports to send
  when the recipient's `ok` comes, or does not. Data held for an absent endpoint
  (hold4Endpoint) becomes a `HeldData` with `held_item` and, when the endpoint attaches, data
  again with `unheld_data`, its dataTiming showing the time it has left.

Reports are RFC 3340 §6.2 statusResponses from `apex=report@DOMAIN` to the data's originator
(`status_report`): a timing or hop error is a permanent failure (550), a delayed delivery a
transient one (350), a final-hop report success (250) and carries a dataTiming option of its own
whose noLaterThan is the original returnTrip (RFC 3342 §2.1.1). No report is made about a
report: that is how report loops start.

Both options are applied whatever their targetHop says: RFC 3342 requires 'all', and a loop
guard or deadline that a wrong attribute switches off would help nobody. Only internal options
count (`_options.find_option`).

Times: relay processing time is counted in whole milliseconds, rounded up, so every hop costs
at least a millisecond whenever any time passed at all (the RFC gives no rounding; erring late
keeps the "no later than" promise).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from broker.holds import HeldData
from broker.names import REPORT_SERVICE
from common.errors import ApexpsError, ParameterSyntaxError

from .codec import BEEP_XML, Data, Option, TargetHop, decode, encode
from .endpoint import Endpoint
from .options import (
    DATA_HOPPING,
    DATA_TIMING,
    HOLD_FOR_ENDPOINT,
    DataTiming,
    data_hopping,
    data_timing,
    find_option,
    replace_option,
)

__all__ = [
    "REPORT_SERVICE",
    "Watch",
    "elapsed_ms",
    "expiry_reports",
    "held_item",
    "holds_requested",
    "next_relay_hop",
    "status_report",
    "timing_left",
    "unheld_data",
    "unhold",
    "watch_delivery",
]

#: statusResponse codes of RFC 3342's reports.
_FAILED, _TRANSIENT, _DELIVERED = 550, 350, 250


@dataclass(frozen=True, slots=True)
class Watch:
    """What the shell does about the recipient's reply to one delivered data (RFC 3342 §2-3).

    Times are seconds from when the MSG is sent."""

    #: no `ok` by then: the delivery failed; send `on_timeout` (if any), release `hold_id`
    deadline: float | None = None
    #: no `ok` by then: send `on_late` (the delivery goes on)
    report_after: float | None = None
    on_timeout: Data | None = None
    on_late: Data | None = None
    #: sent when the `ok` comes in time (the final-hop report)
    on_ok: Data | None = None
    #: the held data this delivers: released on `ok`, held again on `error` or a lost session
    hold_id: str | None = None


def elapsed_ms(received: float | None, now: float) -> int:
    """Whole milliseconds from `received` to `now`, rounded up; 0 if unknown."""
    if received is None:
        return 0
    # rounded to microseconds first: 5 ms between two floats must not come out as 6
    return max(0, math.ceil(round((now - received) * 1000, 3)))


def status_report(domain: str, originator: Endpoint, trans_id: int,
                  statuses: Iterable[tuple[Endpoint, int, str]],
                  options: tuple[Option, ...] = ()) -> Data:
    """A statusResponse (RFC 3340 §6.2, DTD §9.2) from apex=report@`domain` to `originator`."""
    def esc(text: str) -> str:
        return text.replace("&", "&amp;").replace("<", "&lt;").replace("'", "&apos;")
    rows = "".join(
        f"        <destination identity='{esc(str(who))}'>\r\n"
        f"            <reply code='{code}' transID='{trans_id}'"
        + (f">{esc(text)}</reply>\r\n" if text else " />\r\n")
        + "        </destination>\r\n"
        for who, code, text in statuses)
    xml = f"<statusResponse transID='{trans_id}'>\r\n{rows}    </statusResponse>"
    return Data(Endpoint(REPORT_SERVICE, domain), (originator,), xml.encode("utf-8"), BEEP_XML,
                options=options, content_ref="#Content")


def _report(domain: str, data: Data, option: Option, code: int, text: str = "", *,
            options: tuple[Option, ...] = ()) -> list[Data]:
    if data.originator.address == REPORT_SERVICE:
        return []
    return [status_report(domain, data.originator, option.trans_id or 0,
                          [(data.recipients[0], code, text)], options)]


def _all_options(data: Data) -> tuple[Option, ...]:
    return (*data.options, *data.options_of(0))


def _timing(data: Data) -> tuple[Option, DataTiming] | None:
    option = find_option(_all_options(data), DATA_TIMING)
    return None if option is None else (option, data_timing(option))


def _with_timing(data: Data, option: Option, timing: DataTiming) -> Data:
    return replace_option(data, option, replace(option, content=timing.to_xml()))


def holds_requested(data: Data) -> bool:
    """Whether `data` asks to be held for an absent recipient (hold4Endpoint, RFC 3342 §3)."""
    return find_option(_all_options(data), HOLD_FOR_ENDPOINT) is not None


def next_relay_hop(data: Data, domain: str, elapsed: int) -> tuple[Data | None, list[Data]]:
    """Step 5.2 for single-recipient `data`: (what to send the next relay, or None; reports).

    dataHopping (§4): noMoreThan less one; at 0 the data stops (550 report if reportErrors).
    dataTiming (§2.1, §2.2): noLaterThan and reportAfter less `elapsed`; noLaterThan at or
    below 0 stops the data (550 report if reportErrors); reportAfter at or below 0 becomes 0
    and a transient report (350) goes out, the data goes on.
    """
    reports: list[Data] = []
    hop_option = find_option(_all_options(data), DATA_HOPPING)
    if hop_option is not None:
        hops = data_hopping(hop_option)
        if hops.no_more_than:
            if hops.no_more_than - 1 <= 0:
                if hops.report_errors:
                    reports += _report(domain, data, hop_option, _FAILED, "hop limit reached")
                return None, reports
            content = replace(hops, no_more_than=hops.no_more_than - 1).to_xml()
            data = replace_option(data, hop_option, replace(hop_option, content=content))
    found = _timing(data)
    if found is not None:
        option, timing = found
        changed = timing
        if timing.no_later_than:
            left = timing.no_later_than - elapsed
            if left <= 0:
                if timing.report_errors:
                    reports += _report(domain, data, option, _FAILED, "noLaterThan passed")
                return None, reports
            changed = replace(changed, no_later_than=left)
        if timing.report_after:
            left = timing.report_after - elapsed
            if left <= 0:
                left = 0
                reports += _report(domain, data, option, _TRANSIENT)
            changed = replace(changed, report_after=left)
        if changed != timing:
            data = _with_timing(data, option, changed)
    return data, reports


def watch_delivery(data: Data, domain: str, elapsed: int, next_trans_id: Callable[[], int],
                   hold_id: str | None = None) -> tuple[Watch | None, list[Data]]:
    """Step 5.3 for single-recipient `data` going to an attached application: the `Watch`
    (None when there is nothing to watch), and reports due at once. A noLaterThan already
    passed is the caller's to check first (`timing_left`)."""
    found = _timing(data)
    if found is None:
        return (Watch(hold_id=hold_id) if hold_id else None), []
    option, timing = found
    reports: list[Data] = []
    deadline = timing.no_later_than - elapsed if timing.no_later_than else 0
    late = timing.report_after - elapsed if timing.report_after else 0
    if timing.report_after and late <= 0:
        reports += _report(domain, data, option, _TRANSIENT)
    on_ok = None
    if timing.return_trip:
        back = Option(DATA_TIMING, next_trans_id(), target_hop=TargetHop.ALL,
                      must_understand=True,
                      content=DataTiming(no_later_than=timing.return_trip).to_xml())
        on_ok = next(iter(_report(domain, data, option, _DELIVERED, options=(back,))), None)
    watch = Watch(
        deadline=deadline / 1000 if deadline > 0 else None,
        report_after=late / 1000 if late > 0 else None,
        on_timeout=(next(iter(_report(domain, data, option, _FAILED, "noLaterThan passed")),
                         None) if timing.no_later_than and timing.report_errors else None),
        on_late=next(iter(_report(domain, data, option, _TRANSIENT)), None) if late > 0
        else None,
        on_ok=on_ok, hold_id=hold_id)
    if watch == Watch(hold_id=hold_id) and hold_id is None:
        return None, reports
    return watch, reports


def timing_left(data: Data, domain: str, elapsed: int) -> tuple[bool, list[Data]]:
    """Whether single-recipient `data` may still be delivered after `elapsed` ms here; if not,
    the timing error report (when reportErrors asks for one)."""
    found = _timing(data)
    if found is None:
        return True, []
    option, timing = found
    if not timing.no_later_than or timing.no_later_than - elapsed > 0:
        return True, []
    if timing.report_errors:
        return False, _report(domain, data, option, _FAILED, "noLaterThan passed")
    return False, []


def held_item(data: Data, recipient: Endpoint, now_ms: int, elapsed: int) -> HeldData:
    """The `HeldData` that keeps single-recipient `data` for `recipient` (§3): its noLaterThan
    becomes an absolute deadline, its reportAfter an absolute report time."""
    deadline = report_at = None
    found = _timing(data)
    if found is not None:
        timing = found[1]
        if timing.no_later_than:
            deadline = now_ms + timing.no_later_than - elapsed
        if timing.report_after:
            report_at = now_ms + max(0, timing.report_after - elapsed)
    content_type, body = encode(data)
    return HeldData(uuid.uuid4().hex, str(recipient), str(recipient.base), str(data.originator),
                    content_type, body, now_ms, deadline, report_at)


def unheld_data(item: HeldData) -> Data:
    """The data `item` holds, as stored; `ApexpsError` if the bytes are not a data."""
    data = decode(item.content_type, item.data)
    if not isinstance(data, Data):
        raise ParameterSyntaxError("held bytes are not a data operation")
    return data


def unhold(item: HeldData, domain: str, now_ms: int) -> tuple[Data | None, list[Data]]:
    """Held data for delivery now: (data with its dataTiming counting from now, or None if its
    deadline passed; reports -- the timing error report when it did and reportErrors asks)."""
    data = unheld_data(item)
    found = _timing(data)
    if found is None:
        return data, []
    option, timing = found
    if item.deadline is not None and item.deadline <= now_ms:
        return None, (_report(domain, data, option, _FAILED, "noLaterThan passed")
                      if timing.report_errors else [])
    left = replace(
        timing,
        no_later_than=item.deadline - now_ms if item.deadline is not None else 0,
        # a report time that passed while held was reported then (HoldBook.late)
        report_after=max(0, item.report_at - now_ms) if item.report_at is not None else 0)
    return _with_timing(data, option, left), []


def expiry_reports(item: HeldData, domain: str, code: int) -> list[Data]:
    """The report on held data that expired (550, if reportErrors) or is late (350)."""
    try:
        data = unheld_data(item)
    except ApexpsError:
        return []
    found = _timing(data)
    if found is None:
        return []
    option, timing = found
    if code == _FAILED and not timing.report_errors:
        return []
    return _report(domain, data, option, code, "noLaterThan passed" if code == _FAILED else "")
