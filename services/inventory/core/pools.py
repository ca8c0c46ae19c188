"""Pool completeness and validity, as upstream's GatherPools judges them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from services.common.dra.model import ResourceSlice

__all__ = ["PoolStatus", "pool_status"]


@dataclass(frozen=True)
class PoolStatus:
    """One pool as the allocator will see it: only the highest generation counts."""

    driver: str
    pool: str
    generation: int
    resource_slice_count: int
    slices: int  # slices present at that generation
    stale_slices: int  # slices of older generations, ignored
    duplicate_devices: tuple[str, ...]

    @property
    def complete(self) -> bool:
        return self.slices == self.resource_slice_count

    @property
    def valid(self) -> bool:
        return not self.duplicate_devices


def pool_status(slices: Iterable[ResourceSlice]) -> tuple[PoolStatus, ...]:
    """Pool completeness and validity, sorted by (driver, pool)."""
    by_pool: dict[tuple[str, str], list[ResourceSlice]] = {}
    for resource_slice in slices:
        by_pool.setdefault((resource_slice.driver, resource_slice.pool.name), []).append(
            resource_slice
        )
    result = []
    for (driver, pool), members in sorted(by_pool.items()):
        newest = max(s.pool.generation for s in members)
        current = [s for s in members if s.pool.generation == newest]
        names: set[str] = set()
        duplicates: set[str] = set()
        for resource_slice in current:
            for device in resource_slice.devices:
                (duplicates if device.name in names else names).add(device.name)
        result.append(
            PoolStatus(
                driver=driver,
                pool=pool,
                generation=newest,
                resource_slice_count=current[0].pool.resource_slice_count,
                slices=len(current),
                stale_slices=len(members) - len(current),
                duplicate_devices=tuple(sorted(duplicates)),
            )
        )
    return tuple(result)
