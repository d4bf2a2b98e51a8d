"""APEX (RFC 3340) over BEEP, the relay's side: endpoint names, the profile's XML operations
and the documents carried in them (`codec`, `endpoint`, `options`, `pubsub_codec`,
`robust_stamp`, `robust_codec`, `batch_codec`), the relay core (`relay`, `_party`) and the
asyncio server shell around them (`server`).

`endpoint`, `codec` and `relay` do no I/O; `server.py` shuttles bytes between sockets and
`adapters.beep.BeepConnection`. The client library is `adapters.client`, the pubsub service's
wire side `adapters.pubsub`. Everything in `__all__` is public.
"""

from __future__ import annotations

from common.errors import (
    AttachmentOverridden,
    OptionNotImplemented,
    ParameterSyntaxError,
    TransactionFailed,
    TransactionInProgress,
)

from ._party import Watch, status_report
from .codec import (
    APEX_PROFILE,
    Attach,
    Bind,
    Data,
    Error,
    Ok,
    Operation,
    Option,
    TargetHop,
    Terminate,
    decode,
    encode,
)
from .endpoint import MAX_ENDPOINT_LENGTH, Endpoint
from .options import (
    DATA_HOPPING,
    DATA_TIMING,
    HOLD_FOR_ENDPOINT,
    DataHopping,
    DataTiming,
    data_hopping,
    data_timing,
    find_option,
    hop_limit,
    spend_hop,
    with_hops,
)
from .relay import ChannelRef, Delivery, HoldStore, Outcome, Relay, ServiceHandler
from .server import ApexServer, PeerLink

__all__ = [
    "APEX_PROFILE",
    "DATA_HOPPING",
    "DATA_TIMING",
    "HOLD_FOR_ENDPOINT",
    "MAX_ENDPOINT_LENGTH",
    "ApexServer",
    "Attach",
    "AttachmentOverridden",
    "Bind",
    "ChannelRef",
    "Data",
    "DataHopping",
    "DataTiming",
    "Delivery",
    "Endpoint",
    "Error",
    "HoldStore",
    "Ok",
    "Operation",
    "Option",
    "OptionNotImplemented",
    "Outcome",
    "ParameterSyntaxError",
    "PeerLink",
    "Relay",
    "ServiceHandler",
    "TargetHop",
    "Terminate",
    "TransactionFailed",
    "TransactionInProgress",
    "Watch",
    "data_hopping",
    "data_timing",
    "decode",
    "encode",
    "find_option",
    "hop_limit",
    "spend_hop",
    "status_report",
    "with_hops",
]
