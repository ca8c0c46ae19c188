"""mirror.py: which grants outside Kueue become which mirror Workloads (pure values)."""

from __future__ import annotations

from typing import Any

import pytest

from services.bridges.kueue.mirror import (
    MIRROR_LABEL,
    MIRROR_PRIORITY,
    Mirror,
    charged_flavor,
    gpu_flavors,
    is_mirror,
    local_queue,
    mirror_name,
    wanted_mirrors,
)
from services.client.results import Reservation, ReservationState
from services.common.dra.model import DeviceID

HOPPER = {"nvidia.com/gpu.family": "hopper"}
ADA = {"nvidia.com/gpu.family": "ada-lovelace"}
FLAVORS = [("hopper", HOPPER), ("ada", ADA)]
NODES = {
    "h100-node-1": {"kubernetes.io/hostname": "h100-node-1", **HOPPER},
    "l40s-node-1": {"kubernetes.io/hostname": "l40s-node-1", **ADA},
    "a100-node-1": {"nvidia.com/gpu.family": "ampere"},
}


def grant(rid: str, node: str, gpus: int, owner: str = "hpc/slurm/job/7001") -> Reservation:
    devices = tuple(DeviceID("gpu", "pool", f"gpu-{i}") for i in range(gpus))
    return Reservation(rid, owner, node, ReservationState.COMMITTED, devices=devices)


@pytest.mark.parametrize(
    ("reservation_id", "expected"),
    [
        pytest.param("res-16167bad@h100-node-1", "gpualloc-mirror-res-16167bad", id="node-dropped"),
        pytest.param("Res_A.B", "gpualloc-mirror-res-a-b", id="dns-label"),
        pytest.param("r" * 80, "gpualloc-mirror-" + "r" * 47, id="at-most-63"),
    ],
)
def test_a_mirror_is_named_after_its_reservation(reservation_id, expected):
    assert mirror_name(reservation_id) == expected
    assert len(mirror_name(reservation_id)) <= 63


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        pytest.param("h100-node-1", "hopper", id="first-flavor"),
        pytest.param("l40s-node-1", "ada", id="second-flavor"),
        pytest.param("a100-node-1", None, id="no-flavor-covers-it"),
        pytest.param("unknown", None, id="unknown-node"),
    ],
)
def test_the_flavor_charged_is_the_first_whose_node_labels_the_node_carries(node, expected):
    found = charged_flavor(NODES.get(node, {}), FLAVORS)
    assert (found[0] if found else None) == expected


def test_an_unlabelled_flavor_covers_every_node_so_order_decides():
    assert charged_flavor(NODES["l40s-node-1"], [("any", {}), ("ada", ADA)]) == ("any", {})


def test_the_gpu_flavors_are_the_cluster_queues_in_order_for_nvidia_gpu():
    queue: dict[str, Any] = {
        "spec": {
            "resourceGroups": [
                {"coveredResources": ["cpu"], "flavors": [{"name": "cpus"}]},
                {
                    "coveredResources": ["cpu", "nvidia.com/gpu"],
                    "flavors": [{"name": "hopper"}, {"name": "gone"}, {"name": "ada"}],
                },
            ]
        }
    }
    labels = {"cpus": {}, "hopper": HOPPER, "ada": ADA}
    assert gpu_flavors(queue, labels) == [("hopper", HOPPER), ("ada", ADA)]


@pytest.mark.parametrize(
    ("grants", "expected"),
    [
        pytest.param(
            {"hpc": [grant("r1@h100-node-1", "h100-node-1", 8)]},
            {"gpualloc-mirror-r1": ("hpc", "hopper", 8)},
            id="slurm-on-hopper",
        ),
        pytest.param(
            {
                "hpc": [
                    grant("r1@h100-node-1", "h100-node-1", 8),
                    grant("r2@l40s-node-1", "l40s-node-1", 2, "hpc/api"),
                ]
            },
            {"gpualloc-mirror-r1": ("hpc", "hopper", 8), "gpualloc-mirror-r2": ("hpc", "ada", 2)},
            id="one-per-grant",
        ),
        pytest.param(
            {"hpc": [grant("r3@a100-node-1", "a100-node-1", 1)]}, {}, id="no-flavor-no-mirror"
        ),
        pytest.param({"hpc": [grant("r4@h100-node-1", "h100-node-1", 0)]}, {}, id="no-devices"),
        pytest.param({"other": [grant("r5@h100-node-1", "h100-node-1", 1)]}, {}, id="no-queue"),
    ],
)
def test_each_grant_outside_kueue_wants_one_mirror_on_its_charged_flavor(grants, expected):
    wanted = wanted_mirrors(grants, {"hpc": FLAVORS}, NODES)
    got = {
        name: (m.cluster_queue, m.flavor, len(m.reservation.devices)) for name, m in wanted.items()
    }
    assert got == expected


def test_a_mirror_workload_asks_kueue_for_its_gpus_on_its_flavors_nodes():
    mirror = Mirror("hpc", grant("r1@h100-node-1", "h100-node-1", 8), "hopper", HOPPER)
    workload = mirror.workload("gpualloc-mirrors")
    assert is_mirror(workload)
    assert workload["metadata"]["labels"] == {MIRROR_LABEL: "true"}
    assert workload["metadata"]["annotations"]["gpualloc.io/mirror-of"] == "r1@h100-node-1"
    assert workload["spec"]["queueName"] == "gpualloc-hpc"
    assert workload["spec"]["priority"] == MIRROR_PRIORITY  # a user's PriorityClass at most
    (pod_set,) = workload["spec"]["podSets"]
    assert pod_set["count"] == 1
    pod = pod_set["template"]["spec"]
    assert pod["nodeSelector"] == HOPPER
    (container,) = pod["containers"]
    assert container["resources"]["requests"] == {"nvidia.com/gpu": "8"}
    assert local_queue("gpualloc-mirrors", "hpc")["spec"] == {"clusterQueue": "hpc"}
    assert not is_mirror({"metadata": {"labels": {MIRROR_LABEL: "false"}}})
