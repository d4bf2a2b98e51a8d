"""Where apexps keeps local state by default."""

from __future__ import annotations

import os
from pathlib import Path

from common.errors import KafkaNotFound


def default_data_dir() -> Path:
    """$APEXPS_DATA_DIR, else $XDG_STATE_HOME/apexps, else ~/.local/state/apexps."""
    if "APEXPS_DATA_DIR" in os.environ:
        return Path(os.environ["APEXPS_DATA_DIR"])
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "apexps"


def kafka_bootstrap(bootstrap: str | None, data_dir: str | Path) -> str:
    """`--bootstrap` if given, else the local Kafka that `apexps up` (or `apexps kafka start`)
    runs from `data_dir`; `KafkaNotFound` says what to do when there is neither."""
    if bootstrap:
        return bootstrap
    from adapters.local.kafka import LocalKafka  # the JVM launcher, only when it is needed

    state, running = LocalKafka(Path(data_dir) / "kafka").status()
    if state is None or not running:
        raise KafkaNotFound(
            f"no local Kafka runs from {data_dir}; pass --bootstrap HOST:PORT, or start one "
            "with `apexps up` (or `apexps kafka start`)")
    return state.bootstrap
