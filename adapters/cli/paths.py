"""Where apexps keeps local state by default."""

from __future__ import annotations

import os
from pathlib import Path


def default_data_dir() -> Path:
    """$APEXPS_DATA_DIR, else $XDG_STATE_HOME/apexps, else ~/.local/state/apexps."""
    if "APEXPS_DATA_DIR" in os.environ:
        return Path(os.environ["APEXPS_DATA_DIR"])
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "apexps"
