"""Resource event notification (draft-wang-p2psip-event-notification, bound to APEX in
docs/event-binding.md): the pure core. `_model` holds the values and which events a message
causes, `_watches` the subscriptions' state machine. No I/O: adapters/pubsub/events.py journals
the Notifies this decides. Everything in __all__ is re-exported here."""

from ._model import (
    APP_EVENT_OPTION,
    APP_SPECIFIC_START,
    MAX_EVENT,
    PERMANENT,
    Event,
    ExpiresPolicy,
    Reason,
    Resource,
    State,
    app_event,
    check_events,
    events_of,
)
from ._watches import IMPLICIT_ID, ImplicitPolicy, Notify, Watch, WatchKey, WatchTable

__all__ = [
    "APP_EVENT_OPTION",
    "APP_SPECIFIC_START",
    "IMPLICIT_ID",
    "MAX_EVENT",
    "PERMANENT",
    "Event",
    "ExpiresPolicy",
    "ImplicitPolicy",
    "Notify",
    "Reason",
    "Resource",
    "State",
    "Watch",
    "WatchKey",
    "WatchTable",
    "app_event",
    "check_events",
    "events_of",
]
