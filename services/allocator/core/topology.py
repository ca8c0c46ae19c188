"""NodeTopology: how the GPUs of one node are wired, as a pure value the solver can query.

Kubernetes' DRA publishes `resource.kubernetes.io/pcieRoot` and nothing about NVLink, NUMA or
NICs. The inventory knows more (`nvidia-smi topo -m`, NVML): per node, NVLink edges between GPUs
with their link counts (NV1..NV18), the NUMA node, PCIe root complex and PCIe switch of each
GPU, and the NICs with their PCIe relation to each GPU (PIX/PXB/PHB/NODE/SYS, closest first).

Devices are DRA devices (DeviceID). Whole GPUs are listed; a partition (a MIG device) stands
where its GPU stands — same NUMA node, root, switch and NICs — but has no NVLinks (MIG
instances do not do NVLink peer-to-peer). A partition is found through `parents`, or by the
NVIDIA DRA driver's naming rule `<gpu>-mig-...` in the same pool.

`signature()` is the topology with pool names left out: nodes of one hardware model share it,
which lets the solver treat their searches alike (templates.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from functools import cached_property
from typing import Any

import networkx as nx

from services.common.dra.model import DeviceID

__all__ = ["GpuPlace", "NicInfo", "NodeTopology", "PcieRelation"]

_SMALL = 64  # GPUs per node up to which cliques are found by bitmask search


class PcieRelation(IntEnum):
    """A GPU-NIC (or GPU-GPU) PCIe path, closest first: smaller is closer (as `topo -m`)."""

    INTERNAL = 1  # same board
    PIX = 2  # at most one PCIe bridge (one switch)
    PXB = 3  # several bridges, no host bridge
    PHB = 4  # through the host bridge (same root complex)
    NODE = 5  # across root complexes within one NUMA node
    SYS = 6  # across NUMA nodes

    @classmethod
    def parse(cls, text: str) -> PcieRelation:
        """`PIX`, `pxb`, ... (ValueError for anything else)."""
        try:
            return cls[text.strip().upper()]
        except KeyError:
            names = ", ".join(r.name for r in cls)
            raise ValueError(f"unknown PCIe relation {text!r} (one of {names})") from None


@dataclass(frozen=True)
class GpuPlace:
    """Where a GPU hangs: None where unknown."""

    numa: int | None = None
    pcie_root: str | None = None
    pcie_switch: str | None = None


@dataclass(frozen=True)
class NicInfo:
    """A NIC for `NodeTopology.build`: relations to GPUs follow from switch, root and NUMA."""

    name: str
    switch: str | None = None
    pcie_root: str | None = None
    numa: int | None = None


@dataclass(frozen=True, eq=False)
class NodeTopology:
    gpus: Mapping[DeviceID, GpuPlace]
    nvlinks: Mapping[frozenset[DeviceID], int] = field(default_factory=dict)
    nic_relations: Mapping[DeviceID, Mapping[str, PcieRelation]] = field(default_factory=dict)
    parents: Mapping[DeviceID, DeviceID] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        *,
        driver: str = "gpu.nvidia.com",
        pool: str = "",
        nvlinks: Mapping[tuple[str, str], int] | None = None,
        numa: Mapping[str, int] | None = None,
        pcie_roots: Mapping[str, str] | None = None,
        pcie_switches: Mapping[str, str] | None = None,
        nics: Sequence[NicInfo] = (),
        relations: Mapping[tuple[str, str], PcieRelation] | None = None,
        parents: Mapping[str, str] | None = None,
        gpus: Iterable[str] = (),
    ) -> NodeTopology:
        """A topology from device names of one pool (`pool` empty: the caller fills it in
        with `for_pool`, as generated clusters share one topology per hardware model).
        Explicit `relations` (gpu, nic) override the ones derived from `nics`."""
        names = set(gpus)
        for mapping in (numa, pcie_roots, pcie_switches):
            names.update(mapping or {})
        for a, b in nvlinks or {}:
            names.update((a, b))
        for gpu, _ in relations or {}:
            names.add(gpu)

        def ident(name: str) -> DeviceID:
            return DeviceID(driver, pool, name)

        places = {
            ident(n): GpuPlace(
                (numa or {}).get(n), (pcie_roots or {}).get(n), (pcie_switches or {}).get(n)
            )
            for n in sorted(names)
        }
        nic_relations: dict[DeviceID, dict[str, PcieRelation]] = {}
        for device, place in places.items():
            for nic in nics:
                nic_relations.setdefault(device, {})[nic.name] = _derived_relation(place, nic)
        for (gpu_name, nic_name), relation in (relations or {}).items():
            nic_relations.setdefault(ident(gpu_name), {})[nic_name] = relation
        return cls(
            gpus=places,
            nvlinks={frozenset((ident(a), ident(b))): n for (a, b), n in (nvlinks or {}).items()},
            nic_relations=nic_relations,
            parents={ident(p): ident(g) for p, g in (parents or {}).items()},
        )

    def for_pool(self, pool: str) -> NodeTopology:
        """The same wiring with every device in `pool`."""

        def move(device: DeviceID) -> DeviceID:
            return DeviceID(device.driver, pool, device.device)

        return NodeTopology(
            gpus={move(d): p for d, p in self.gpus.items()},
            nvlinks={frozenset(move(d) for d in pair): n for pair, n in self.nvlinks.items()},
            nic_relations={move(d): r for d, r in self.nic_relations.items()},
            parents={move(p): move(g) for p, g in self.parents.items()},
        )

    # --- queries ------------------------------------------------------------------------

    def gpu_of(self, device: DeviceID) -> DeviceID | None:
        """The GPU a device is or is carved from; None when the topology does not know it."""
        if device in self.gpus:
            return device
        parent = self.parents.get(device)
        if parent is not None:
            return parent
        head, mig, _ = device.device.partition("-mig-")
        if mig:
            candidate = DeviceID(device.driver, device.pool, head)
            if candidate in self.gpus:
                return candidate
        return None

    def is_whole_gpu(self, device: DeviceID) -> bool:
        return device in self.gpus

    def place(self, device: DeviceID) -> GpuPlace | None:
        gpu = self.gpu_of(device)
        return None if gpu is None else self.gpus[gpu]

    def links(self, a: DeviceID, b: DeviceID) -> int:
        """NVLinks between two whole GPUs (0: none, or a partition)."""
        return self.nvlinks.get(frozenset((a, b)), 0)

    def nic_relation(self, device: DeviceID) -> PcieRelation | None:
        """The closest NIC of the device's GPU; None without NICs or when unknown."""
        gpu = self.gpu_of(device)
        relations = self.nic_relations.get(gpu) if gpu is not None else None
        return min(relations.values()) if relations else None

    def nvlink_bandwidth(self, devices: Iterable[DeviceID]) -> int:
        """Sum of NVLinks over every pair of the devices (a placement's NVLink score)."""
        chosen = sorted(set(devices))
        return sum(
            self.links(chosen[i], chosen[j])
            for i in range(len(chosen))
            for j in range(i + 1, len(chosen))
        )

    def largest_clique(self, devices: Iterable[DeviceID], min_links: int = 1) -> int:
        """The most of `devices` that are pairwise connected by >= min_links NVLinks."""
        members = frozenset(d for d in devices if d in self.gpus)
        if len(members) <= 1:
            return len(members)
        key = (members, min_links)
        found = self._cliques.get(key)
        if found is None:
            if len(self.gpus) <= _SMALL:
                found = self._small_clique(members, min_links)
            else:
                graph = self._graph(min_links).subgraph(members)
                found = max(1, max((len(c) for c in nx.find_cliques(graph)), default=0))
            if len(self._cliques) >= 4096:
                self._cliques.clear()
            self._cliques[key] = found
        return found

    def _small_clique(self, members: frozenset[DeviceID], min_links: int) -> int:
        """Exact maximum clique by bitmasks (a node has at most a few dozen GPUs)."""
        order = sorted(members)
        bit = {d: 1 << i for i, d in enumerate(order)}
        adjacent = self._adjacent(min_links)
        neighbours = [sum(bit.get(o, 0) for o in adjacent.get(d, ())) for d in order]

        def grow(candidates: int, size: int) -> int:
            best = size
            while candidates:
                if size + bin(candidates).count("1") <= best:
                    break
                low = candidates & -candidates
                index = low.bit_length() - 1
                candidates ^= low
                best = max(best, grow(candidates & neighbours[index], size + 1))
            return best

        return grow((1 << len(order)) - 1, 0)

    def _adjacent(self, min_links: int) -> Mapping[DeviceID, tuple[DeviceID, ...]]:
        """Per GPU, the GPUs it has >= min_links NVLinks with (read once per topology, not
        once per pair and clique)."""
        found = self._adjacency.get(min_links)
        if found is None:
            pairs: dict[DeviceID, list[DeviceID]] = {}
            if min_links <= 0:  # no link needed: every other GPU
                pairs = {d: [o for o in self.gpus if o != d] for d in self.gpus}
            for pair, links in self.nvlinks.items() if min_links > 0 else ():
                if links >= min_links and len(pair) == 2:
                    a, b = pair
                    pairs.setdefault(a, []).append(b)
                    pairs.setdefault(b, []).append(a)
            found = self._adjacency[min_links] = {d: tuple(o) for d, o in pairs.items()}
        return found

    @cached_property
    def _adjacency(self) -> dict[int, Mapping[DeviceID, tuple[DeviceID, ...]]]:
        return {}

    @cached_property
    def _cliques(self) -> dict[tuple[frozenset[DeviceID], int], int]:
        return {}

    def _graph(self, min_links: int) -> Any:
        cache = self._graphs
        found = cache.get(min_links)
        if found is None:
            graph = nx.Graph()
            graph.add_nodes_from(self.gpus)
            graph.add_edges_from(tuple(p) for p, n in self.nvlinks.items() if n >= min_links)
            found = cache[min_links] = graph
        return found

    @cached_property
    def _graphs(self) -> dict[int, Any]:
        return {}

    def signature(self) -> tuple[Any, ...]:
        """Pool-free content, for grouping nodes of one hardware model."""
        return self._signature

    @cached_property
    def _signature(self) -> tuple[Any, ...]:
        def key(device: DeviceID) -> tuple[str, str]:
            return (device.driver, device.device)

        return (
            tuple(
                sorted(
                    (key(d), p.numa or -1, p.pcie_root or "", p.pcie_switch or "")
                    for d, p in self.gpus.items()
                )
            ),
            tuple(
                sorted((tuple(sorted(key(d) for d in pair)), n) for pair, n in self.nvlinks.items())
            ),
            tuple(
                sorted((key(d), tuple(sorted(r.items()))) for d, r in self.nic_relations.items())
            ),
            tuple(sorted((key(p), key(g)) for p, g in self.parents.items())),
        )


def _derived_relation(place: GpuPlace, nic: NicInfo) -> PcieRelation:
    if place.pcie_switch is not None and place.pcie_switch == nic.switch:
        return PcieRelation.PIX
    if place.pcie_root is not None and place.pcie_root == nic.pcie_root:
        return PcieRelation.PHB
    if place.numa is not None and place.numa == nic.numa:
        return PcieRelation.NODE
    return PcieRelation.SYS
