"""The inventory's instruments (services/common/telemetry.py configures the exporters).

| name | kind | what |
|---|---|---|
| `gpualloc.rpc.server.duration` | histogram, ms | per RPC method and status code (common) |
| `gpualloc.inventory.server.updates` | counter | generations made, per `reason` (apply, ...) |
| `gpualloc.inventory.server.generation` | gauge | the inventory's newest generation |
| `gpualloc.inventory.server.nodes` | gauge | nodes held |
| `gpualloc.inventory.server.slices` | gauge | ResourceSlices held |

(`server`: the inventory process itself; the allocator's `gpualloc.inventory.*` gauges are its
view of it, so `generation` there minus here is how far an allocator lags behind.)
"""

from __future__ import annotations

from services.common.telemetry import Telemetry
from services.inventory.app.service import InventoryService
from services.inventory.core.state import Change, InventoryState

__all__ = ["instrument_inventory"]


def instrument_inventory(service: InventoryService, telemetry: Telemetry) -> None:
    """Count `service`'s changes and report its size at each collection (no-op meter: free)."""
    if not telemetry.enabled:
        return
    updates = telemetry.meter.create_counter(
        "gpualloc.inventory.server.updates", description="inventory generations made"
    )

    def on_change(state: InventoryState, change: Change) -> None:
        updates.add(1, {"reason": change.reason})

    service.subscribe(on_change)
    telemetry.observe(
        "gpualloc.inventory.server.generation",
        lambda: service.generation,
        description="the inventory's newest generation",
    )
    telemetry.observe(
        "gpualloc.inventory.server.nodes",
        lambda: service.snapshot().node_count,
        description="nodes the inventory holds",
    )
    telemetry.observe(
        "gpualloc.inventory.server.slices",
        lambda: len(service.snapshot().slice_keys),
        description="ResourceSlices the inventory holds",
    )
