"""The BEEP core as it was before its fast paths (commit 3af2f9a): the reference that
`tests/beep/test_fast_paths.py` compares the optimized `adapters.beep` against.

These are verbatim copies of the modules the optimization changed (`_frames`, `_window`, `_mime`,
`_session`, `_channel`, `_events`, `_connection`); the unchanged ones (`_config`, `_errors`,
`_management`) are imported from `adapters.beep` instead. Do not edit them to follow a change of
behaviour in `adapters.beep`: a property that fails against this reference means the optimized
code does something the old code did not. If behaviour is changed on purpose, say so and retire
or regenerate the reference.
"""

from ._connection import BeepConnection
from ._frames import FrameDecoder

__all__ = ["BeepConnection", "FrameDecoder"]
