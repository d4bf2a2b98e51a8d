"""One exception hierarchy for all of apexps, each class carrying the reply code it answers with.

Theory of operation
-------------------
APEX (RFC 3340 §10), BEEP (RFC 3080 §8) and the pubsub drafts share one three-digit reply-code
space, so the whole product uses one `ReplyCode` enum and one root exception, `ApexpsError`.
Every leaf class sets `code` (what goes on the wire in `<error code=…>` or `<reply code=…>`),
`retriable` (may the same request succeed later, unchanged?) and a one-line `description`.
Whoever turns an exception into a wire reply only ever reads `exc.code` and `str(exc)`; nothing
compares message strings.

`ApexpsError.for_code(code)` maps a code received from a peer back to the most general class
registered for it, falling back to `UnknownReplyError`, so a client library raises the same
classes the server raised (aiokafka's `for_code` pattern).

This module sits in `broker/` because the domain raises most of these; the wire layers import it
(dependencies point inward).
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar

__all__ = [
    "AccessDenied",
    "ApexpsError",
    "AttachmentOverridden",
    "AuthenticationFailed",
    "AuthenticationRequired",
    "BadGapRange",
    "ConfigError",
    "EncryptionRequired",
    "EventNotUnderstood",
    "ExpiresTooBrief",
    "IncorrectSelector",
    "InvalidMessage",
    "InvalidParameter",
    "InvalidSchema",
    "InvalidTopicName",
    "JournalUnavailable",
    "KafkaNotFound",
    "LinkContextGone",
    "MechanismInsufficient",
    "MessageNotConforming",
    "NotTaken",
    "NotYourLink",
    "OptionNotImplemented",
    "ParameterSyntaxError",
    "RebuildRefused",
    "RecordSchemaError",
    "ReplyCode",
    "SelectorError",
    "ServiceNotAvailable",
    "SyntaxError_",
    "TemporaryAuthFailure",
    "TransactionFailed",
    "TransactionInProgress",
    "UnknownReplyError",
    "UnknownResource",
    "UnknownSchemaFingerprint",
    "UnknownSubscription",
    "UnsupportedSelectorClass",
]


class ReplyCode(IntEnum):
    """Reply codes of RFC 3340 §10 and RFC 3080 §8, plus those the pubsub drafts add."""

    #: RFC 3340: transaction successful.
    SUCCESS = 250
    #: RFC 3342 §3 (dataTiming): transient report, the data is still on its way.
    TRANSIENT = 350
    #: RFC 3340: service not available.
    SERVICE_NOT_AVAILABLE = 421
    #: RFC 3340: requested action not taken (e.g., lock already in use).
    NOT_TAKEN_TRANSIENT = 450
    #: RFC 3340: requested action aborted (e.g., local error in processing).
    ABORTED = 451
    #: RFC 3340: temporary authentication failure.
    TEMPORARY_AUTH_FAILURE = 454
    #: RFC 3340: general syntax error (e.g., poorly-formed XML).
    SYNTAX_ERROR = 500
    #: RFC 3340: syntax error in parameters (e.g., non-valid XML).
    PARAMETER_SYNTAX_ERROR = 501
    #: RFC 3340: parameter not implemented.
    NOT_IMPLEMENTED = 504
    #: RFC 3340: authentication required.
    AUTH_REQUIRED = 530
    #: RFC 3340: authentication mechanism insufficient.
    AUTH_MECHANISM_INSUFFICIENT = 534
    #: RFC 3340: authentication failure.
    AUTH_FAILURE = 535
    #: RFC 3340: action not authorized for user.
    NOT_AUTHORIZED = 537
    #: RFC 3340: authentication mechanism requires encryption.
    ENCRYPTION_REQUIRED = 538
    #: RFC 3340: requested action not taken (e.g., no requested profiles are acceptable).
    NOT_TAKEN = 550
    #: RFC 3340: parameter invalid.
    PARAMETER_INVALID = 553
    #: RFC 3340: transaction failed (e.g., policy violation).
    TRANSACTION_FAILED = 554
    #: RFC 3340: transaction already in progress.
    IN_PROGRESS = 555
    #: RFC 3342 §2 (attachOverride): the attachment was overridden by a newer one.
    OVERRIDDEN = 556
    #: Content-based pubsub §5.9.1: invalid message structure.
    INVALID_MESSAGE = 561
    #: Content-based pubsub §5.8.1: unsupported message selector class.
    UNSUPPORTED_SELECTOR_CLASS = 566
    #: Content-based pubsub §5.8.1: incorrect message selector.
    INCORRECT_SELECTOR = 567
    #: Content-based pubsub §5.8.2: invalid topic name and subscription identifier.
    UNKNOWN_SUBSCRIPTION = 568
    #: apexps robust binding (docs/robust-binding.md): the broker no longer holds what this
    #: link carried (reset, retention passed, or never existed); repair by source instead.
    LINK_CONTEXT_GONE = 569
    #: apexps robust binding: a gap fill or source repair too large or too old to rebuild.
    REBUILD_REFUSED = 570
    #: apexps event binding (docs/event-binding.md, P2PSIP event notification §3.3.1 b): the
    #: notifier does not understand an event the subscribe names.
    EVENT_NOT_UNDERSTOOD = 571
    #: apexps event binding (§3.3.1 c): Expires above zero but below the notifier's minimum;
    #: the reply carries `min-expires`.
    EXPIRES_TOO_BRIEF = 572

    @property
    def is_success(self) -> bool:
        return 200 <= self < 300

    @property
    def is_transient(self) -> bool:
        """4xx codes: the same request may succeed later."""
        return 400 <= self < 500


class ApexpsError(Exception):
    """Root of every error apexps raises on purpose.

    Subclasses set the class attributes; instances carry a human-readable message that says what
    went wrong and, where there is one, what to do about it. Never instantiate this class itself.
    """

    code: ClassVar[ReplyCode] = ReplyCode.ABORTED
    retriable: ClassVar[bool] = False
    description: ClassVar[str] = "requested action aborted"

    _registry: ClassVar[dict[int, type[ApexpsError]]] = {}

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # The first (most general) class declared for a code is the one for_code() returns.
        ApexpsError._registry.setdefault(int(cls.code), cls)

    def __init__(self, message: str | None = None) -> None:
        if type(self) is ApexpsError:
            raise TypeError("ApexpsError is abstract; raise one of its subclasses")
        super().__init__(message or self.description)

    @property
    def message(self) -> str:
        return str(self.args[0])

    @classmethod
    def for_code(cls, code: int, message: str | None = None) -> ApexpsError:
        """The exception a peer's reply code stands for (UnknownReplyError if none is known)."""
        klass = cls._registry.get(int(code))
        if klass is None:
            return UnknownReplyError(code, message)
        return klass(message)


class UnknownReplyError(ApexpsError):
    """A peer answered with a code this version does not know."""

    description = "unknown reply code"

    def __init__(self, code: int, message: str | None = None) -> None:
        super().__init__(f"{code}: {message or self.description}")
        self.received_code = code


# --- 4xx: try again later -------------------------------------------------------------------


class ServiceNotAvailable(ApexpsError):
    code = ReplyCode.SERVICE_NOT_AVAILABLE
    retriable = True
    description = "service not available"


class JournalUnavailable(ServiceNotAvailable):
    """Kafka did not take or did not answer in time; nothing was acknowledged."""

    description = "the journal (Kafka) is not available; retry later"


class KafkaNotFound(ServiceNotAvailable):
    """No Kafka answers at the configured bootstrap address."""

    description = "no Kafka answers at the bootstrap address"


class TemporaryAuthFailure(ApexpsError):
    """454: authentication cannot proceed now (e.g. too many failed attempts on this session)."""

    code = ReplyCode.TEMPORARY_AUTH_FAILURE
    retriable = True
    description = "temporary authentication failure"


# --- 5xx: the request itself is wrong -------------------------------------------------------


class SyntaxError_(ApexpsError):
    code = ReplyCode.SYNTAX_ERROR
    description = "general syntax error"


class InvalidParameter(ApexpsError):
    code = ReplyCode.PARAMETER_INVALID
    description = "parameter invalid"


class InvalidTopicName(InvalidParameter):
    description = "not an acceptable topic name"


class InvalidSchema(InvalidParameter):
    """553: a createtopic's message or selector schema is refused: not XML Schema, not
    self-contained (an import, include or redefine; a `uri` to fetch), or too large. No topic
    is created (docs/pubsub-service.md, "Schemas")."""

    description = "message or selector schema refused"


class BadGapRange(InvalidParameter):
    """553: a gap request's link range is malformed: negative, 0 (a reset carries nothing),
    beyond the link's bit resolution, backwards (linkfrom after linkto and not a wrap-around
    range), or naming link seqs the link has not carried yet."""

    description = "bad link sequence range"


class ParameterSyntaxError(ApexpsError):
    """501: well-formed input that is not valid (e.g. XML not valid against the APEX DTD)."""

    code = ReplyCode.PARAMETER_SYNTAX_ERROR
    description = "syntax error in parameters (non-valid XML)"


class RecordSchemaError(ParameterSyntaxError):
    """A record does not fit its Avro schema; nothing was written or read."""

    description = "record does not match its schema"


class UnknownSchemaFingerprint(RecordSchemaError):
    """A stored record names a writer schema this version does not ship."""

    description = "record written with an unknown schema"


class ConfigError(ParameterSyntaxError):
    description = "invalid configuration"


class OptionNotImplemented(ApexpsError):
    """504: an option marked mustUnderstand='true' that this relay does not know (RFC 3340 §5)."""

    code = ReplyCode.NOT_IMPLEMENTED
    description = "parameter not implemented"


class TransactionFailed(ApexpsError):
    """554: e.g. another application is already attached as this endpoint (RFC 3340 §4.4.1)."""

    code = ReplyCode.TRANSACTION_FAILED
    description = "transaction failed"


class TransactionInProgress(ApexpsError):
    """555: the transID names an operation still in force on this channel (RFC 3340 §4.4.1)."""

    code = ReplyCode.IN_PROGRESS
    description = "transaction already in progress"


class AttachmentOverridden(ApexpsError):
    """556 (RFC 3342 §2): a newer attach with attachOverride took this endpoint over."""

    code = ReplyCode.OVERRIDDEN
    description = "attachment overridden"


class AccessDenied(ApexpsError):
    code = ReplyCode.NOT_AUTHORIZED
    description = "action not authorized"


class NotYourLink(AccessDenied):
    """537: the link named in a gap or repair request belongs to another subscriber."""

    description = "the link belongs to another subscriber"


class AuthenticationRequired(ApexpsError):
    """530: the listener serves this only to an authenticated peer (RFC 3080 §4)."""

    code = ReplyCode.AUTH_REQUIRED
    description = "authentication required"


class MechanismInsufficient(ApexpsError):
    """534: the SASL mechanism is too weak for this listener (RFC 3080 §4.1.1)."""

    code = ReplyCode.AUTH_MECHANISM_INSUFFICIENT
    description = "authentication mechanism insufficient"


class AuthenticationFailed(ApexpsError):
    """535: the credentials were refused (unknown user and wrong password look the same)."""

    code = ReplyCode.AUTH_FAILURE
    description = "authentication failure"


class EncryptionRequired(ApexpsError):
    """538: the mechanism sends secrets in the clear, so it needs TLS first (e.g. SASL PLAIN)."""

    code = ReplyCode.ENCRYPTION_REQUIRED
    description = "authentication mechanism requires encryption"


class NotTaken(ApexpsError):
    code = ReplyCode.NOT_TAKEN
    description = "requested action not taken"


class InvalidMessage(ApexpsError):
    code = ReplyCode.INVALID_MESSAGE
    description = "invalid message structure"


class MessageNotConforming(InvalidMessage):
    """561 (content-based draft §5.9.1): a publication does not conform to its topic's message
    schema; the text names the first violation and its line. Nothing is journaled."""

    description = "message does not conform to the topic's message schema"


class UnsupportedSelectorClass(ApexpsError):
    code = ReplyCode.UNSUPPORTED_SELECTOR_CLASS
    description = "unsupported message selector class"


class SelectorError(ApexpsError):
    """An incorrect selector; `position` is the 0-based character offset of the problem."""

    code = ReplyCode.INCORRECT_SELECTOR
    description = "incorrect message selector"

    def __init__(self, message: str | None = None, position: int | None = None) -> None:
        text = message or self.description
        if position is not None:
            text = f"{text} (at position {position})"
        super().__init__(text)
        self.position = position
        self.reason = message or self.description


IncorrectSelector = SelectorError


class UnknownSubscription(ApexpsError):
    code = ReplyCode.UNKNOWN_SUBSCRIPTION
    description = "invalid topic name and subscription identifier"


class LinkContextGone(ApexpsError):
    """569: the broker cannot refill this link range: the link was reset since, its records are
    past the link retention window, or the link is unknown. The subscriber repairs by source
    (its last source seq per source); the link goes on from its current epoch."""

    code = ReplyCode.LINK_CONTEXT_GONE
    description = "link context gone: the link was reset; repair by source"


class RebuildRefused(ApexpsError):
    """570: the broker refuses to rebuild: a gap larger than its maximum gap fill, or a source
    repair that reaches past the journal's retention or beyond its maximum repair size."""

    code = ReplyCode.REBUILD_REFUSED
    description = "rebuild refused: too large or too old"


class UnknownResource(NotTaken):
    """550: the resource a watch names is not the notifier's (event draft §3.3.1 a): its topic
    does not exist here."""

    description = "unknown resource: no such topic here"


class EventNotUnderstood(ApexpsError):
    """571: a watch names an event the notifier does not understand (event draft §3.3.1 b)."""

    code = ReplyCode.EVENT_NOT_UNDERSTOOD
    description = "event not understood"


class ExpiresTooBrief(ApexpsError):
    """572: a watch's Expires is above zero but below the notifier's minimum (event draft
    §3.3.1 c); `min_expires` is the least it accepts, in seconds, and travels in the reply."""

    code = ReplyCode.EXPIRES_TOO_BRIEF
    description = "expires below the notifier's minimum"

    def __init__(self, message: str | None = None, *, min_expires: int = 0) -> None:
        super().__init__(message)
        self.min_expires = min_expires

