"""The client library: what an application uses to talk to an apexps relay.

Layers, each built on the one before:
- `client.ApexClient`: one attached endpoint over one BEEP session (the asyncio shell around an
  INITIATOR `adapters.beep.BeepConnection`; `_transport` and `_outlet` are its parts).
- `reconnect.ReconnectingApexClient`: the same, surviving the loss of its relay.
- `pubsub_client.PubsubClient`: the apex=pubsub service's documents as method calls.
- `publisher.ReliablePublisher`: publishing without loss or duplicates across reconnects.
- `robust_client.RobustSubscriber`: a contiguous stream per link, driving `resequencer.
  Resequencer` (sans-I/O: stamps in, deliveries and gap/repair requests out) and keeping its
  positions in a `positions_file.PositionsFile`.

The wire vocabulary (codecs, endpoint names) is `adapters.apex`'s; this package only uses it.
Everything in `__all__` is public.
"""

from __future__ import annotations

from .client import ApexClient
from .positions_file import PositionsFile
from .publisher import ReliablePublisher
from .pubsub_client import Delivered, Ended, LinkEvent, PubsubClient
from .reconnect import ReconnectingApexClient, ReconnectPolicy
from .resequencer import Positions, Resequencer
from .robust_client import Message, RobustSubscriber

__all__ = [
    "ApexClient",
    "Delivered",
    "Ended",
    "LinkEvent",
    "Message",
    "Positions",
    "PositionsFile",
    "PubsubClient",
    "ReconnectPolicy",
    "ReconnectingApexClient",
    "ReliablePublisher",
    "Resequencer",
    "RobustSubscriber",
]
