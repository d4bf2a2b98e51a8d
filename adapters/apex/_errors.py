"""The reply-code classes APEX raises, re-exported from the one hierarchy in broker/errors.py.

They live there so `ApexpsError.for_code` knows every code in every process, whether or not
this package was imported.
"""

from __future__ import annotations

from broker.errors import (
    AttachmentOverridden,
    OptionNotImplemented,
    ParameterSyntaxError,
    TransactionFailed,
    TransactionInProgress,
)

__all__ = [
    "AttachmentOverridden",
    "OptionNotImplemented",
    "ParameterSyntaxError",
    "TransactionFailed",
    "TransactionInProgress",
]
