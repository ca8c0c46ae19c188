"""The inventory's persistence port: where the state survives a restart or a failover.

`save` is called once per change, in generation order, with the new state and what changed
(the keys to rewrite); `load` returns the last saved state, or None when nothing was saved. A
state comes back with the same generation, slices, Nodes and reports (its views are rebuilt
from them, and its change log starts empty).
"""

from __future__ import annotations

from typing import Protocol

from services.inventory.core.state import Change, InventoryState

__all__ = ["InventoryRepository"]


class InventoryRepository(Protocol):
    def load(self) -> InventoryState | None: ...

    def save(self, state: InventoryState, change: Change) -> None: ...

    def close(self) -> None: ...
