"""The apex=pubsub service's wire side.

`handler.PubsubHandler` is the service the relay calls for data to `apex=pubsub@D` and
`apex=pubsub/TOPIC@D`: documents in, `broker.pubsub.PubsubService` and the journal called, data
out. With a link log it hands deliveries to `sequenced.SequencedFanout`, the asyncio driver of
the delivery core (link seqs, gap fill, repair, heartbeats, snapshots). The service's names
(`apex=pubsub`, the default hop count) are `broker.names`'.
"""

from __future__ import annotations

from .handler import PubsubHandler
from .sequenced import SequencedFanout

__all__ = ["PubsubHandler", "SequencedFanout"]
