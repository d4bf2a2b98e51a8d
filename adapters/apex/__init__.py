"""APEX (RFC 3340) over BEEP: endpoint names, the profile's XML operations, the relay core, and
thin asyncio shells (`server`, `client`) around them.

`_endpoint`, `_codec` and `_relay` do no I/O; `server.py` and `client.py` shuttle bytes between
sockets and `adapters.beep.BeepConnection`. Everything in `__all__` is public.
"""

from __future__ import annotations

from ._endpoint import MAX_ENDPOINT_LENGTH, Endpoint
from ._errors import (
    AttachmentOverridden,
    OptionNotImplemented,
    ParameterSyntaxError,
    TransactionFailed,
    TransactionInProgress,
)

__all__ = [
    "MAX_ENDPOINT_LENGTH",
    "AttachmentOverridden",
    "Endpoint",
    "OptionNotImplemented",
    "ParameterSyntaxError",
    "TransactionFailed",
    "TransactionInProgress",
]
