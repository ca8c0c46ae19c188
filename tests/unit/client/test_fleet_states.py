"""client/fleet.py: the states `get nodes`, `get devices` and `describe node` show. A tainted
GPU nothing holds is `tainted`, never counted free, and `get nodes` has a TAINTED column."""

from __future__ import annotations

import pytest

from services.client.fleet import Use, fleet_view
from services.client.inventory import InventoryDevice, NodeInventory
from services.client.live_output import fleet_node_to_dict, node_headers, node_row, table
from services.common.dra.model import Device, DeviceID
from tests.builders import XID_TAINT

NODE = "dgx-a"


def gpu(name: str, *, tainted: bool = False) -> InventoryDevice:
    device = Device(name, taints=(XID_TAINT,) if tainted else ())
    return InventoryDevice(DeviceID("gpu.nvidia.com", NODE, name), device, gpu_uuid=f"GPU-{name}")


@pytest.mark.parametrize(
    ("devices", "free", "tainted", "uses"),
    [
        pytest.param([gpu("gpu-0")], 1, 0, ["free"], id="a-healthy-gpu-is-free"),
        pytest.param(
            [gpu("gpu-0", tainted=True)], 0, 1, ["tainted"], id="a-tainted-gpu-is-not-free"
        ),
        pytest.param(
            [gpu("gpu-0"), gpu("gpu-1", tainted=True)],
            1,
            1,
            ["free", "tainted"],
            id="one-of-two-tainted",
        ),
    ],
)
def test_a_tainted_gpu_is_its_own_state(devices, free, tainted, uses):
    (node,) = fleet_view([NodeInventory(NODE, devices=tuple(devices))], [])
    assert [d.use.value for d in node.devices] == uses
    assert (sum(g.free for g in node.gpus), sum(g.tainted for g in node.gpus)) == (free, tainted)
    shown = fleet_node_to_dict(node)
    assert (shown["freeGPUs"], shown["taintedGPUs"]) == (free, tainted)
    assert shown["devices"][Use.TAINTED.value] == tainted


@pytest.mark.parametrize("wide", [pytest.param(False, id="default"), pytest.param(True, id="wide")])
def test_get_nodes_counts_tainted_gpus_in_their_own_column(wide):
    devices = (gpu("gpu-0"), gpu("gpu-1", tainted=True), gpu("gpu-2", tainted=True))
    (node,) = fleet_view([NodeInventory(NODE, devices=devices)], [])
    headers = node_headers(wide=wide)
    assert len(set(headers)) == len(headers)  # -o wide adds columns, never a second TAINTED
    shown = dict(zip(headers, node_row(node, wide=wide), strict=True))
    assert (shown["GPUS"], shown["FREE"], shown["TAINTED"]) == (3, 1, 2)
    lines = table(headers, [node_row(node, wide=wide)]).splitlines()
    width = len("NAME    MODEL    GPUS   FREE   TAINTED   RESERVED   COMMITTED   MIG-FREE")
    assert [line[:width].rstrip() for line in lines] == [
        "NAME    MODEL    GPUS   FREE   TAINTED   RESERVED   COMMITTED   MIG-FREE",
        "dgx-a   <none>   3      1      2         0          0           -",
    ]
