"""MIG geometry: known profile tables, the profile-name rule, and the counter model.

Partitionable MIG follows the NVIDIA DRA driver (k8s-dra-driver-gpu cmd/gpu-kubelet-plugin
partitions.go, KEP-4815): one counter set per GPU whose counters are, per capacity dimension, the
maximum over all profiles, plus `memory-slice-<i>` = 1 for every memory slice; each profile x
placement is a device that consumes its own capacities and the memory slices it covers. A
dimension is modelled only when every profile's value is known, so a table with gaps never
under-counts. One addition of ours: a profile whose `max_instances` is below its number of
placements (the `+me` profiles: one instance) gets a `profile-<id>-instances` counter, because
with engine counts unknown the memory slices alone would let two of them fit.

Tables are the real values in shared/reference/nvidia-dra-attributes.md section 8 (go-nvml A100
mock confirmed by real XML; H100 ids/placements from a real `nvidia-smi mig -lgipp`). H200 is not
here: its profile ids and placements were never observed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from services.common.dra.quantity import Quantity, QuantityFormat
from services.inventory.core.report import MigDevice, MigProfile, Placement

__all__ = [
    "KNOWN_PROFILE_TABLES",
    "MigDimension",
    "MIG_DIMENSIONS",
    "consumed_counters",
    "counter_set_counters",
    "fits",
    "forced_placements",
    "identify_profile",
    "mig_profile_name",
    "modelled_dimensions",
    "profile_capacities",
]

_MIB = 2**20


def _p(starts: Iterable[int], size: int) -> tuple[Placement, ...]:
    return tuple(Placement(s, size) for s in starts)


# MigProfile columns: name, id, slice_count, placements, memory_mib, multiprocessors,
# copy_engines, decoders, encoders, jpeg_engines, ofa_engines, max_instances.


def _a100(mem: tuple[int, int, int, int, int], names: tuple[str, ...]) -> tuple[MigProfile, ...]:
    """A100 40GB and 80GB share ids, placements, SMs and engines; only memory and names differ.
    `mem` = memorySizeMB of (1g, 1g two-slice, 2g, 3g/4g, 7g)."""
    one, one_two, two, three, seven = mem
    return (
        MigProfile(names[0], 19, 1, _p(range(7), 1), one, 14, 1, 0, 0, 0, 0, 7),
        MigProfile(names[1], 20, 1, _p(range(7), 1), one, 14, 1, 1, 0, 1, 1, 1),
        MigProfile(names[2], 15, 1, _p((0, 2, 4, 6), 2), one_two, 14, 1, 1, 0, 0, 0, 4),
        MigProfile(names[3], 14, 2, _p((0, 2, 4), 2), two, 28, 2, 1, 0, 0, 0, 3),
        MigProfile(names[4], 9, 3, _p((0, 4), 4), three, 42, 3, 2, 0, 0, 0, 2),
        MigProfile(names[5], 5, 4, _p((0,), 4), three, 56, 4, 2, 0, 0, 0, 1),
        MigProfile(names[6], 0, 7, _p((0,), 8), seven, 98, 7, 5, 0, 1, 1, 1),
    )


_A100_40GB = _a100(
    (4864, 9856, 9856, 19968, 40192),
    ("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
)
_A100_80GB = _a100(
    (9856, 19968, 19968, 40192, 80384),
    ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
)
# H100 80GB HBM3: memorySizeMB was never observed (nvidia-smi's MIG fb total is a different
# number), nor SMs/engines of 1g.10gb+me, 1g.20gb, 4g.40gb, 7g.80gb. H100 has no NVENC: 0 encoders.
_H100_80GB = (
    MigProfile("1g.10gb", 19, 1, _p(range(7), 1), None, 16, 1, 1, 0, 1, 0, 7),
    MigProfile("1g.10gb+me", 20, 1, _p(range(7), 1), None, None, None, None, 0, None, None, 1),
    MigProfile("1g.20gb", 15, 1, _p((0, 2, 4, 6), 2), None, None, None, None, 0, None, None, 4),
    MigProfile("2g.20gb", 14, 2, _p((0, 2, 4), 2), None, 32, 2, 2, 0, 2, 0, 3),
    MigProfile("3g.40gb", 9, 3, _p((0, 4), 4), None, 60, 3, 3, 0, 3, 0, 2),
    MigProfile("4g.40gb", 5, 4, _p((0,), 4), None, None, None, None, 0, None, None, 1),
    MigProfile("7g.80gb", 0, 7, _p((0,), 8), None, None, None, None, 0, None, None, 1),
)

KNOWN_PROFILE_TABLES: Mapping[str, tuple[MigProfile, ...]] = {
    "0x20B010DE": _A100_40GB,  # A100-SXM4-40GB
    "0x20B210DE": _A100_80GB,  # A100-SXM4-80GB
    "0x233010DE": _H100_80GB,  # H100 80GB HBM3 SXM
}


# --- names ----------------------------------------------------------------------------------

# GPU instance profile enum (NVML_GPU_INSTANCE_PROFILE_*) -> name suffix (go-nvlib mig_profile.go)
_SUFFIX_BY_ENUM = {0x7: "+me", 0x8: "+me", 0xF: "+me.all", 0x10: "+me.all", 0xD: "-me", 0xE: "-me"}
_SUFFIX_BY_ENUM.update({0xA: "+gfx", 0xB: "+gfx", 0xC: "+gfx", 0x11: "+gfx"})


def mig_profile_name(
    slice_count: int,
    memory_mib: int,
    total_memory_bytes: int,
    profile_enum: int = 0,
    compute_slices: int | None = None,
) -> str:
    """`<C>c.<G>g.<GB>gb[suffix]` as go-nvlib derives it: GB rounds the profile's share of eight
    memory slices up, times the GPU's memory in whole GiB (A100-40GB 4864 MiB -> `1g.5gb`)."""
    total_gib = math.ceil(total_memory_bytes / 2**30)
    eighths = math.ceil(8 * memory_mib * _MIB / total_memory_bytes)
    gigabytes = math.floor(eighths / 8 * total_gib + 0.5)  # Go's math.Round: halves go up
    prefix = f"{compute_slices}c." if compute_slices and compute_slices != slice_count else ""
    return f"{prefix}{slice_count}g.{gigabytes}gb{_SUFFIX_BY_ENUM.get(profile_enum, '')}"


# --- counters -------------------------------------------------------------------------------


@dataclass(frozen=True)
class MigDimension:
    """One capacity of a MIG device and the counter that backs it (DRA driver names)."""

    counter: str
    capacity: str
    value: Callable[[MigProfile], int | None]
    binary: bool = False  # bytes, printed in binary SI

    def quantity(self, profile: MigProfile) -> Quantity | None:
        raw = self.value(profile)
        if raw is None:
            return None
        if self.binary:
            return Quantity.of(raw * _MIB, QuantityFormat.BINARY_SI)
        return Quantity.of(raw)


MIG_DIMENSIONS: tuple[MigDimension, ...] = (
    MigDimension("multiprocessors", "multiprocessors", lambda p: p.multiprocessors),
    MigDimension("copy-engines", "copyEngines", lambda p: p.copy_engines),
    MigDimension("decoders", "decoders", lambda p: p.decoders),
    MigDimension("encoders", "encoders", lambda p: p.encoders),
    MigDimension("jpeg-engines", "jpegEngines", lambda p: p.jpeg_engines),
    MigDimension("ofa-engines", "ofaEngines", lambda p: p.ofa_engines),
    MigDimension("memory", "memory", lambda p: p.memory_mib, binary=True),
)
_ONE = Quantity.of(1)


def modelled_dimensions(profiles: Sequence[MigProfile]) -> tuple[MigDimension, ...]:
    """The dimensions every profile knows: only those become counters."""
    return tuple(d for d in MIG_DIMENSIONS if all(d.value(p) is not None for p in profiles))


def _limited(profiles: Sequence[MigProfile]) -> tuple[MigProfile, ...]:
    return tuple(
        p for p in profiles if p.max_instances is not None and p.max_instances < len(p.placements)
    )


def _memory_slice_count(profiles: Sequence[MigProfile]) -> int:
    return max((pl.start + pl.size for p in profiles for pl in p.placements), default=0)


def counter_set_counters(profiles: Sequence[MigProfile]) -> dict[str, Quantity]:
    """The shared counters of one MIG-capable GPU (see the module docstring)."""
    counters: dict[str, Quantity] = {}
    for dimension in modelled_dimensions(profiles):
        counters[dimension.counter] = max(
            q for p in profiles if (q := dimension.quantity(p)) is not None
        )
    for i in range(_memory_slice_count(profiles)):
        counters[f"memory-slice-{i}"] = _ONE
    for profile in _limited(profiles):
        counters[f"profile-{profile.id}-instances"] = Quantity.of(profile.max_instances or 0)
    return counters


def consumed_counters(
    profiles: Sequence[MigProfile], profile: MigProfile, placement: Placement
) -> dict[str, Quantity]:
    """What the device for `profile` at `placement` takes from its GPU's counter set."""
    consumed: dict[str, Quantity] = {}
    for dimension in modelled_dimensions(profiles):
        quantity = dimension.quantity(profile)
        if quantity is not None:
            consumed[dimension.counter] = quantity
    for i in placement.slices:
        consumed[f"memory-slice-{i}"] = _ONE
    if profile in _limited(profiles):
        consumed[f"profile-{profile.id}-instances"] = _ONE
    return consumed


def profile_capacities(profile: MigProfile) -> dict[str, Quantity]:
    """The device capacities of a MIG profile (DRA driver CommonCapacitiesMig), where known."""
    return {d.capacity: q for d in MIG_DIMENSIONS if (q := d.quantity(profile)) is not None}


def fits(counters: Mapping[str, Quantity], consumers: Iterable[Mapping[str, Quantity]]) -> bool:
    """Whether the consumers together stay within the counters (a counter not in the set is 0)."""
    used: dict[str, Quantity] = {}
    for consumption in consumers:
        for name, quantity in consumption.items():
            used[name] = used[name] + quantity if name in used else quantity
    return all(name in counters and q <= counters[name] for name, q in used.items())


# --- existing MIG devices ---------------------------------------------------------------------


def identify_profile(profiles: Sequence[MigProfile], device: MigDevice) -> MigProfile | None:
    """The one profile whose known values all equal the device's (SMs, engines, memory), or None.

    Used for `nvidia-smi -q -x`, which names no profile. A device that is a compute-instance
    slice of its GPU instance has fewer SMs than any profile and stays unidentified.
    """
    have_by_counter = {
        "multiprocessors": device.multiprocessors,
        "copy-engines": device.copy_engines,
        "decoders": device.decoders,
        "encoders": device.encoders,
        "jpeg-engines": device.jpeg_engines,
        "ofa-engines": device.ofa_engines,
        "memory": _mib(device.memory_bytes),
    }
    pairs = [(have_by_counter[d.counter], d.value) for d in MIG_DIMENSIONS]
    candidates = [
        p
        for p in profiles
        if all(have is None or want(p) is None or have == want(p) for have, want in pairs)
        and any(have is not None and want(p) is not None for have, want in pairs)
    ]
    return candidates[0] if len(candidates) == 1 else None


def _mib(memory_bytes: int | None) -> int | None:
    return None if memory_bytes is None else memory_bytes // _MIB


def forced_placements(existing: Sequence[MigProfile]) -> dict[int, frozenset[Placement]]:
    """For GPU instances whose profile is known but placement is not (the XML case): per profile
    id, the placements every valid packing of `existing` uses. Profiles whose placements differ
    between packings are left out, so a placement is named only when it is certain."""
    order = sorted(existing, key=lambda p: (len(p.placements), p.id))
    seen: dict[int, set[frozenset[Placement]]] = {}

    def place(i: int, taken: frozenset[int], chosen: tuple[tuple[int, Placement], ...]) -> None:
        if i == len(order):
            for profile_id in {pid for pid, _ in chosen}:
                used = frozenset(pl for pid, pl in chosen if pid == profile_id)
                seen.setdefault(profile_id, set()).add(used)
            return
        profile = order[i]
        previous = [pl for pid, pl in chosen if pid == profile.id]
        for placement in profile.placements:
            if previous and placement <= previous[-1]:
                continue  # identical instances: one order of placements is enough
            if taken.isdisjoint(placement.slices):
                place(i + 1, taken | set(placement.slices), (*chosen, (profile.id, placement)))

    place(0, frozenset(), ())
    return {pid: next(iter(sets)) for pid, sets in seen.items() if len(sets) == 1}
