"""The embedded InventoryRepository: the state in memory, optionally a snapshot file on disk.

Without a file this only hands the last saved state back (a service rebuilt in the same process
resumes; a restarted process starts empty). With a file, every save schedules a write of the
whole state as JSON; a background thread writes at most once per `min_interval` seconds, so a
burst of changes costs one write, and `close` (or `flush`) writes what is pending. A write goes to
a temporary file in the same directory, is fsynced and renamed over the snapshot, so a crash
leaves the previous snapshot or the new one, never half of one. A restart therefore loses at most
the changes of the last `min_interval` seconds; use Redis when that matters.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from pathlib import Path

from services.common.errors import InvalidArgument, ParseError
from services.inventory.adapters.store.state_codec import state_from_json, state_to_json
from services.inventory.core.state import Change, InventoryState

__all__ = ["EmbeddedInventoryRepository", "write_atomically"]

log = logging.getLogger(__name__)


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text`: temp file in the same directory, fsync, rename."""
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


class EmbeddedInventoryRepository:
    def __init__(self, snapshot_path: str | Path | None = None, min_interval: float = 1.0) -> None:
        self.snapshot_path = Path(snapshot_path) if snapshot_path else None
        self.min_interval = min_interval
        self._saved: InventoryState | None = None
        self._written_generation = -1
        self._lock = threading.Lock()  # guards _saved / _written_generation
        self._write_lock = threading.Lock()  # one file write at a time
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._writer: threading.Thread | None = None

    def load(self) -> InventoryState | None:
        with self._lock:
            if self._saved is not None:
                return self._saved
        path = self.snapshot_path
        if path is None or not path.exists():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ParseError(error.msg, str(path), error.lineno) from None
        if not isinstance(data, dict):
            raise InvalidArgument.at(str(path), "must hold a JSON object")
        state = state_from_json(data, str(path))
        with self._lock:
            self._saved = state
            self._written_generation = state.generation
        return state

    def save(self, state: InventoryState, change: Change) -> None:
        with self._lock:
            self._saved = state
        if self.snapshot_path is None:
            return
        if self._writer is None:
            self._writer = threading.Thread(
                target=self._write_loop, name="inventory-snapshot", daemon=True
            )
            self._writer.start()
        self._dirty.set()

    def flush(self) -> None:
        """Write the latest saved state now, if it is not on disk yet."""
        if self.snapshot_path is None:
            return
        with self._write_lock:
            with self._lock:
                state = self._saved
                if state is None or state.generation == self._written_generation:
                    return
            text = json.dumps(state_to_json(state), separators=(",", ":"))
            write_atomically(self.snapshot_path, text)
            with self._lock:
                self._written_generation = state.generation

    def _write_loop(self) -> None:
        while not self._stop.is_set():
            self._dirty.wait()
            self._dirty.clear()
            if self._stop.is_set():
                return
            try:
                self.flush()
            except OSError:
                log.exception("writing the inventory snapshot failed; will retry")
                self._dirty.set()
            self._stop.wait(self.min_interval)

    def close(self) -> None:
        self._stop.set()
        self._dirty.set()
        if self._writer is not None:
            self._writer.join(timeout=10)
        self.flush()
