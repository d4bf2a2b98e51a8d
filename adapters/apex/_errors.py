"""The reply codes APEX needs that `broker/errors.py` has no class for (RFC 3340 §10).

Importing this module registers the classes with `ApexpsError.for_code`, so a client that
receives `<error code='555'>` raises `TransactionInProgress`, the class the relay raised.
"""

from __future__ import annotations

from broker.errors import ApexpsError, ReplyCode

__all__ = [
    "AttachmentOverridden",
    "OptionNotImplemented",
    "ParameterSyntaxError",
    "TransactionFailed",
    "TransactionInProgress",
]


class ParameterSyntaxError(ApexpsError):
    """501: well-formed XML that is not valid against the APEX DTD (RFC 3340 §9.1)."""

    code = ReplyCode.PARAMETER_SYNTAX_ERROR
    description = "syntax error in parameters (non-valid XML)"


class OptionNotImplemented(ApexpsError):
    """504: an option marked mustUnderstand='true' that this relay does not know (§5)."""

    code = ReplyCode.NOT_IMPLEMENTED
    description = "parameter not implemented"


class TransactionFailed(ApexpsError):
    """554: e.g. another application is already attached as this endpoint (§4.4.1 step 5)."""

    code = ReplyCode.TRANSACTION_FAILED
    description = "transaction failed"


class TransactionInProgress(ApexpsError):
    """555: the transID names an operation still in force on this channel (§4.4.1 step 1)."""

    code = ReplyCode.IN_PROGRESS
    description = "transaction already in progress"


class AttachmentOverridden(ApexpsError):
    """556 (RFC 3342 §2): a newer attach with attachOverride took this endpoint over."""

    code = ReplyCode.OVERRIDDEN
    retriable = False
    description = "attachment overridden"
