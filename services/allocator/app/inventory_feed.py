"""The allocator's inventory port: how the GPU view reaches an allocator process.

The allocator never imports the inventory (import-linter: services talk through protos only).
It defines this port instead, and the composition root plugs in one of:

- `adapters.inventory.watch_client.InventoryClient`: WatchInventory over gRPC, when the services run
  apart (reconnects, resumes from the last generation, replaces everything on RESET);
- an in-process adapter over the inventory service, written in `services/serve.py`, when both
  run in one process;
- `StaticFeed`: fixed slices and nodes, for tests and `gpualloc-allocator --seed`.

A feed calls `on_update` with `InventoryUpdate`s: the first one has `reset=True` and the whole
view; later ones carry only the node keys that changed, each with that key's complete current
slices (a key with no slices left is deleted). Updates may come from any thread, one at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from services.allocator.core import NodeTopology
from services.common.dra.limits import DocumentLimits
from services.common.dra.model import Node, ResourceSlice
from services.common.manifests import load_manifests

__all__ = [
    "CLUSTER_KEY",
    "Closeable",
    "InventoryFeed",
    "InventoryUpdate",
    "StaticFeed",
    "node_key",
]

CLUSTER_KEY = ""
"""The node key of slices that are not local to one node (nodeSelector, allNodes, per device)."""


def node_key(resource_slice: ResourceSlice) -> str:
    """The key a slice is filed under: its node, or CLUSTER_KEY."""
    return resource_slice.node_name or CLUSTER_KEY


@dataclass(frozen=True)
class InventoryUpdate:
    """One change of the GPU view.

    `reset`: replace everything with this content (the first update of a feed, a RESET after a
    watcher fell behind). Otherwise `slices` has only the keys that changed, each with its
    complete current slices (empty: the key is gone), and `nodes` the Node objects that changed
    (None: deleted).
    """

    generation: int
    reset: bool
    slices: Mapping[str, tuple[ResourceSlice, ...]] = field(default_factory=dict)
    nodes: Mapping[str, Node | None] = field(default_factory=dict)
    # How each changed node's GPUs are wired (NVLink, NUMA, PCIe, NICs); None: unknown/removed.
    topologies: Mapping[str, NodeTopology | None] = field(default_factory=dict)


class Closeable(Protocol):
    def close(self) -> None:
        """Stop delivering updates (idempotent)."""
        ...


class InventoryFeed(Protocol):
    def follow(self, on_update: Callable[[InventoryUpdate], None]) -> Closeable:
        """Start delivering updates to `on_update` (the first has `reset=True` as soon as the
        feed has a view); returns the handle that stops it."""
        ...


@dataclass(frozen=True)
class _Done:
    def close(self) -> None:
        return None


class StaticFeed:
    """A feed that never changes: one reset update, at generation 1, when followed."""

    def __init__(
        self, slices: Iterable[ResourceSlice], nodes: Iterable[Node] = (), generation: int = 1
    ) -> None:
        self._slices = tuple(slices)
        self._nodes = tuple(nodes)
        self._generation = generation

    @classmethod
    def from_paths(cls, paths: Sequence[str], limits: DocumentLimits | None = None) -> StaticFeed:
        """The ResourceSlices and Nodes in manifest files or directories (other kinds, e.g.
        DeviceClasses or claims next to them, are skipped); each file within `limits`."""
        objects = load_manifests(paths, limits=limits)
        return cls(
            (o for o in objects if isinstance(o, ResourceSlice)),
            (o for o in objects if isinstance(o, Node)),
        )

    def update(self) -> InventoryUpdate:
        by_key: dict[str, list[ResourceSlice]] = {}
        for resource_slice in self._slices:
            by_key.setdefault(node_key(resource_slice), []).append(resource_slice)
        return InventoryUpdate(
            generation=self._generation,
            reset=True,
            slices={key: tuple(found) for key, found in by_key.items()},
            nodes={node.name: node for node in self._nodes},
        )

    def follow(self, on_update: Callable[[InventoryUpdate], None]) -> Closeable:
        on_update(self.update())
        return _Done()
