"""FRAGMENTATION_AWARE on the NVIDIA driver's MIG layout (loadtest/clusters.py's A100 80GB nodes,
counters from services/inventory/core/mig.py): where slices and whole GPUs go, and the measure."""

from __future__ import annotations

from fractions import Fraction

import pytest

from loadtest.clusters import A100, DRIVER, L40S, device_classes, generate
from services.allocator.core import (
    Allocated,
    AllocatedState,
    ClusterSnapshot,
    FragmentationMix,
    Policy,
    SelectorCache,
    solve,
)
from services.allocator.core.fragmentation import node_usable, node_usable_change
from services.common.dra.model import (
    AllocationResult,
    DeviceRequest,
    DeviceRequestAllocationResult,
    DeviceSelector,
    ExactDeviceRequest,
    ResourceClaim,
)

CLASSES = device_classes()
ATTR = f"device.attributes['{DRIVER}']"


def mig(profile: str) -> ResourceClaim:
    selector = DeviceSelector(f"{ATTR}.profile == '{profile}'")
    return ResourceClaim(
        "slice", requests=(DeviceRequest("mig", ExactDeviceRequest("mig.nvidia.com", (selector,))),)
    )


def gpus(count: int) -> ResourceClaim:
    request = DeviceRequest("gpus", ExactDeviceRequest("gpu.nvidia.com", count=count))
    return ResourceClaim("whole", requests=(request,))


def cluster(*models: object) -> ClusterSnapshot:
    """One node per model: A100 nodes in the MIG layout, L40S plain."""
    generated = generate(8 * len(models), mig_every=1, partly_used=False, mix=models)  # type: ignore[arg-type]
    return ClusterSnapshot.build(generated.slices, generated.nodes)


def held(node: str, *devices: str) -> tuple[str, AllocationResult]:
    results = tuple(DeviceRequestAllocationResult("x", DRIVER, node, d) for d in devices)
    return (f"default/held-{node}", AllocationResult(results))


def place(
    snapshot: ClusterSnapshot,
    claim: ResourceClaim,
    policy: Policy,
    holdings: list[tuple[str, AllocationResult]],
) -> Allocated:
    state = AllocatedState.build(snapshot, holdings)
    outcome = solve(snapshot, state, CLASSES, [claim], policy=policy, selectors=SelectorCache())
    assert isinstance(outcome, Allocated)
    return outcome


def test_a_slice_fills_the_partitioned_gpu_where_it_keeps_the_big_block_free() -> None:
    snapshot = cluster(A100)
    # gpu-3 holds a 1g slice at memory slice 0: its block 4-7 still takes a 3g.
    holdings = [held("a100-00000", "gpu-3-mig-1g10gb-19-0")]
    outcome = place(snapshot, mig("1g.10gb"), Policy.FRAGMENTATION_AWARE, holdings)
    [picked] = outcome.allocations[0].results
    assert picked.device in {f"gpu-3-mig-1g10gb-19-{s}" for s in (1, 2, 3)}
    assert outcome.score.fragmentation <= 0
    first = place(snapshot, mig("1g.10gb"), Policy.FIRST_FIT, holdings)
    assert first.allocations[0].results[0].device == "gpu-0-mig-1g10gb-19-0"  # a fresh GPU


def test_whole_gpus_go_where_no_slice_could_go() -> None:
    snapshot = cluster(A100, L40S)  # a100-00000 (MIG layout) and l40s-00001, both free
    binpack = place(snapshot, gpus(1), Policy.BINPACK, [])
    aware = place(snapshot, gpus(1), Policy.FRAGMENTATION_AWARE, [])
    assert binpack.node == "a100-00000"  # equal capacity: the name decides
    assert aware.node == "l40s-00001"


def test_a_gpu_from_the_most_broken_node() -> None:
    snapshot = cluster(L40S, L40S)
    holdings = [held("l40s-00000", *(f"gpu-{i}" for i in range(5)))]  # 3 free vs 8 free
    aware = place(snapshot, gpus(2), Policy.FRAGMENTATION_AWARE, holdings)
    assert aware.node == "l40s-00000"


def test_usable_capacity_of_a_fresh_and_a_partitioned_gpu() -> None:
    snapshot = cluster(A100)
    view = snapshot.view("a100-00000")
    state = AllocatedState(snapshot)
    fresh = node_usable(view.devices(), lambda e: False, state.counter_amount)
    assert fresh.whole == 8
    taken = AllocatedState.build(snapshot, [held("a100-00000", "gpu-0-mig-3g40gb-9-0")])
    after = node_usable(view.devices(), lambda e: taken.in_use(e.id), taken.counter_amount)
    assert after.whole == 7
    assert after.partitions < fresh.partitions
    mix = FragmentationMix()
    assert fresh.value(mix) - after.value(mix) > 1  # a whole GPU and its partitions


@pytest.mark.parametrize(
    ("size", "weight"),
    [
        pytest.param(Fraction(1, 9), Fraction(3), id="near-an-eighth"),
        pytest.param(Fraction(2, 5), Fraction(1), id="near-a-half"),
    ],
)
def test_partition_weights_follow_the_nearest_share(size: Fraction, weight: Fraction) -> None:
    mix = FragmentationMix(
        partitions=((Fraction(1, 8), Fraction(3)), (Fraction(1, 2), Fraction(1)))
    )
    assert mix.partition_weight(size) == weight
    assert FragmentationMix().partition_weight(size) == 1


@pytest.mark.parametrize(
    ("free", "value"),
    [
        pytest.param(8, 32, id="a-free-node-takes-every-size"),
        pytest.param(7, 21, id="seven-take-all-but-8"),
        pytest.param(4, 12, id="four-take-1-2-4"),
        pytest.param(3, 6, id="three-take-1-2"),
        pytest.param(1, 1, id="one-takes-1"),
        pytest.param(0, 0, id="none"),
    ],
)
def test_whole_gpus_are_usable_by_every_job_size_they_can_hold(free: int, value: int) -> None:
    assert FragmentationMix().whole_value(free) == value


@pytest.mark.parametrize(
    "device",
    [
        pytest.param("gpu-3-mig-2g20gb-14-2", id="a-slice-of-a-partitioned-gpu"),
        pytest.param("gpu-5-mig-3g40gb-9-4", id="a-slice-of-a-free-gpu"),
        pytest.param("gpu-6", id="a-whole-gpu"),
    ],
)
def test_usable_change_is_usable_before_and_after(device: str) -> None:
    snapshot = cluster(A100)
    view = snapshot.view("a100-00000")
    state = AllocatedState.build(snapshot, [held("a100-00000", "gpu-3-mig-1g10gb-19-0")])
    entry = next(e for e in view.devices() if e.id.device == device)
    pairs = zip(entry.counters, entry.amounts, strict=True)
    added = {counter: amount for (counter, _), amount in pairs}
    before, after = node_usable_change(
        view.devices(), lambda e: state.in_use(e.id), state.counter_amount, {entry.id}, added
    )
    assert before == node_usable(view.devices(), lambda e: state.in_use(e.id), state.counter_amount)
    assert after == node_usable(
        view.devices(),
        lambda e: state.in_use(e.id) or e.id == entry.id,
        lambda c: state.counter_amount(c) + added.get(c, 0),
    )
    assert after.value(FragmentationMix()) < before.value(FragmentationMix())
