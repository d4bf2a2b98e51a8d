"""The delivery core: the sequenced fan-out's decisions as a state machine without I/O.

`DeliveryCore` takes events (entries forwarded, appends settled, repair and snapshot requests,
time) and emits actions (`Send`, `RepairAnswer`); the link log, the routing state, the catch-up
reads and the clocks are ports (`broker.delivery.ports`). The asyncio driver that renders its
actions as APEX data lives in adapters/.
"""

from .actions import Action, Durable, Emit, Outgoing, RepairAnswer, RepairJob, RepairReset, Send
from .core import APPENDS_IN_FLIGHT, GATHER_LIMIT, REPAIR_CHUNK, DeliveryCore
from .ports import CatchUpDone, CatchUpReader, Clock, Defer, LinkLogPort, Routes, WallClock

__all__ = [
    "APPENDS_IN_FLIGHT",
    "GATHER_LIMIT",
    "REPAIR_CHUNK",
    "Action",
    "CatchUpDone",
    "CatchUpReader",
    "Clock",
    "Defer",
    "DeliveryCore",
    "Durable",
    "Emit",
    "LinkLogPort",
    "Outgoing",
    "RepairAnswer",
    "RepairJob",
    "RepairReset",
    "Routes",
    "Send",
    "WallClock",
]
