"""`PositionsFile`: a subscriber stub's `Positions` kept in a file across application restarts.

A write must never leave a torn or empty file behind, whatever kills the process: the JSON goes
to a temporary file in the same directory, is fsync'd, and replaces the old file with
`os.replace` (atomic on POSIX and Windows); then the directory is fsync'd so the rename itself
survives a power cut. A reader therefore sees the old positions or the new ones, never a mix.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from common.errors import ConfigError

from .resequencer import Positions

__all__ = ["PositionsFile"]


class PositionsFile:
    """The file at `path` (created on the first `save`; its directory must exist)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def load(self) -> Positions | None:
        """The positions saved last, or None if there is no file yet.

        Raises:
            ParameterSyntaxError: 501, the file holds something else than positions.
            ConfigError: the file exists but cannot be read.
        """
        try:
            text = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ConfigError(f"cannot read the positions file {self.path}: {exc}") from None
        return Positions.from_json(text)

    def save(self, positions: Positions) -> None:
        """Replace the file's contents with `positions`, atomically and durably (blocks for an
        fsync or two: call it from a worker thread on a busy event loop).

        Raises:
            ConfigError: the file cannot be written (the old contents stay as they were).
        """
        data = positions.to_json().encode() + b"\n"
        directory = self.path.parent
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp",
                                       dir=directory)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            _fsync_directory(directory)
        except OSError as exc:
            raise ConfigError(f"cannot write the positions file {self.path}: {exc}") from None


def _fsync_directory(directory: Path) -> None:
    if not hasattr(os, "O_DIRECTORY"):  # Windows: a directory cannot be opened; NTFS
        return                          # journals the rename itself
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
