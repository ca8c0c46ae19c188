"""gres.conf from the inventory, Slurm-type claims, and the TaskProlog output format."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from services.bridges.slurm.claims import claim_for_node
from services.bridges.slurm.gresconf import (
    gpu_type,
    parse_mig_minors,
    render_gres_conf,
)
from services.bridges.slurm.prolog import JobGpus
from services.bridges.slurm.request import request_from_options
from services.client.inventory import InventoryDevice, NodeInventory
from services.common.dra.model import AttributeValue, DeviceID
from services.common.errors import InvalidArgument
from tests.unit.bridges.support import DATA, example_nodes, solve

SLURM = DATA / "slurm"


def node(name: str) -> NodeInventory:
    return next(n for n in example_nodes() if n.name == name)


def entries(text: str) -> list[dict[str, str]]:
    """key=value pairs of each non-comment line of a gres.conf (keys lower-cased)."""
    found = []
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            found.append({k.lower(): v for k, v in re.findall(r"(\w+)=(\S+)", line)})
    return found


@pytest.mark.parametrize(
    ("product", "expected"),
    [
        pytest.param("NVIDIA H100 80GB HBM3", "h100", id="h100"),
        pytest.param("NVIDIA A100-SXM4-40GB", "a100", id="a100-dashes"),
        pytest.param("NVIDIA L40S", "l40s", id="l40s"),
        pytest.param("Tesla T4", "t4", id="t4"),
        pytest.param("NVIDIA GeForce RTX 2060", "nvidia_geforce_rtx_2060", id="autodetect-name"),
    ],
)
def test_gpu_types(product, expected):
    assert gpu_type(product) == expected


def test_gres_conf_uses_slurms_own_keys():
    documented = {k for e in entries((SLURM / "gres-conf-examples.conf").read_text()) for k in e}
    # Links and MultipleFiles are gres.conf(5) parameters the examples do not happen to use.
    written = {k for n in example_nodes() for e in entries(render_gres_conf(n)) for k in e}
    assert written <= documented | {"links", "multiplefiles"}
    assert {"nodename", "autodetect", "name", "type", "file"} <= written


def test_h100_node_lists_eight_gpus_with_nvlink():
    lines = entries(render_gres_conf(node("h100-node-1")))
    assert [e["file"] for e in lines] == [f"/dev/nvidia{i}" for i in range(8)]
    assert {e["type"] for e in lines} == {"h100"}
    first = lines[0]["links"].split(",")
    assert first == ["-1", *["18"] * 7]
    assert "Gres=gpu:h100:8" in render_gres_conf(node("h100-node-1"))


def test_no_nvlink_no_links():
    lines = entries(render_gres_conf(node("l40s-node-1")))
    assert len(lines) == 4 and not any("links" in e for e in lines)


def created_mig(base: NodeInventory, device: str, gi: int) -> NodeInventory:
    """`base` with one MIG device marked as existing, as the inventory marks it from a report."""
    devices = []
    for d in base.devices:
        if d.id.device == device:
            attributes = {
                **d.device.attributes,
                "gpualloc.io/migCreated": AttributeValue.bool_(True),
                "gpualloc.io/gpuInstanceId": AttributeValue.int_(gi),
                "uuid": AttributeValue.string("MIG-0f9a6c2e-1d3b-5e7a-9c4d-2b8e6f1a3c5d"),
            }
            d = InventoryDevice(d.id, replace(d.device, attributes=attributes))
        devices.append(d)
    return replace(base, devices=tuple(devices))


MIG_MINORS = "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n"


def test_existing_mig_with_minors_gets_multiple_files():
    a100 = created_mig(node("a100-node-1"), "gpu-0-mig-3g20gb-9-0", gi=1)
    text = render_gres_conf(a100, parse_mig_minors(MIG_MINORS))
    lines = entries(text)
    mig = [e for e in lines if "multiplefiles" in e]
    assert mig == [
        {
            "nodename": "a100-node-1",
            "autodetect": "off",
            "name": "gpu",
            "type": "a100_3g.20gb",
            "multiplefiles": ",".join(
                ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13"]
            ),
        }
    ]
    # gpu-0 is partitioned: not listed whole; the other three are
    assert sorted(e["file"] for e in lines if "file" in e) == [f"/dev/nvidia{i}" for i in (1, 2, 3)]
    assert "Gres=gpu:a100:3,gpu:a100_3g.20gb:1" in text


def test_existing_mig_without_minors_is_left_to_autodetect():
    a100 = created_mig(node("a100-node-1"), "gpu-0-mig-3g20gb-9-0", gi=1)
    text = render_gres_conf(a100)
    assert "NodeName=a100-node-1 AutoDetect=nvml" in text.splitlines()
    assert entries(text) == [{"nodename": "a100-node-1", "autodetect": "nvml"}]
    assert "gpu:a100_3g.20gb:1" in text


def test_bad_mig_minors_line():
    with pytest.raises(InvalidArgument) as raised:
        parse_mig_minors("config 1\ngpu0/gi1/access\n")
    assert raised.value.field_path == "mig-minors:2"


@pytest.mark.parametrize(
    ("options", "node_prefix", "device_part", "count"),
    [
        pytest.param({"gres": "gpu:h100:4"}, "h100-node", "gpu-", 4, id="typed-gres"),
        pytest.param(
            {"gres": "gpu:a100_3g.20gb:2"}, "a100-node", "-mig-3g20gb-", 2, id="slurm-mig-type"
        ),
        pytest.param({"gpus_per_node": "l40s:2"}, "l40s-node", "gpu-", 2, id="gpus-per-node"),
        pytest.param(
            {"gres": "gpu:a100:1,gpu:a100_1g.5gb:1"}, "a100-node", "", 2, id="whole-and-mig"
        ),
    ],
)
def test_slurm_claims_allocate_on_the_example_cluster(
    options, node_prefix, device_part, count, tmp_path
):
    claim = claim_for_node("42", request_from_options(**options))
    code, report = solve([claim], tmp_path)
    assert code == 0, report
    assert report["node"].startswith(node_prefix)
    results = report["claims"][0]["allocation"]["devices"]["results"]
    assert len(results) == count and all(device_part in r["device"] for r in results)


def test_task_prolog_output_is_what_slurm_reads():
    example = (SLURM / "taskprolog-example.sh").read_text()
    verbs = {m.split()[0] for m in re.findall(r'^echo "([^"]+)"', example, flags=re.M)}
    assert verbs == {"export", "unset", "print"}
    gpus = JobGpus(
        "a100-node-1",
        ("res-1",),
        (
            DeviceID("gpu.nvidia.com", "a100-node-1", "gpu-0"),
            DeviceID("gpu.nvidia.com", "a100-node-1", "gpu-1-mig-1g5gb-19-0"),
        ),
        ("GPU-eb3e4f6a-3797-e9e3-768c-5652d8cc1971",),
        (DeviceID("gpu.nvidia.com", "a100-node-1", "gpu-1-mig-1g5gb-19-0"),),
    )
    lines = gpus.exports()
    assert lines[0] == "export CUDA_VISIBLE_DEVICES=GPU-eb3e4f6a-3797-e9e3-768c-5652d8cc1971"
    for line in lines:
        verb, _, rest = line.partition(" ")
        assert verb in verbs
        if verb == "export":
            assert re.fullmatch(r"[A-Z_]+=\S*", rest)
