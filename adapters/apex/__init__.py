"""APEX (RFC 3340) over BEEP: endpoint names, the profile's XML operations, the relay core, and
thin asyncio shells (`server`, `client`) around them.

`_endpoint`, `_codec` and `_relay` do no I/O; `server.py` and `client.py` shuttle bytes between
sockets and `adapters.beep.BeepConnection`. Everything in `__all__` is public.
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
