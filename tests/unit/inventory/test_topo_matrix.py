"""parse_topo_matrix on the three real `nvidia-smi topo -m` samples, a synthetic one in the real
layout of newer drivers (tabs, NICs, legend, ANSI header), and broken input."""

from __future__ import annotations

from itertools import permutations
from pathlib import Path

import pytest

from services.common.errors import ParseError
from services.inventory.adapters.sources.topo_matrix import parse_topo_matrix
from services.inventory.core.report import CpuRange, GpuLink, TopologyLevel

DATA = Path(__file__).parents[2] / "data" / "topo"
H100 = "8x-h100_nv18_ml-engineering.txt"
NV2 = "2x-gpu_nv2_ml-engineering.txt"
PHB = "2x-gpu_phb-no-nvlink_ml-engineering.txt"


def parse(name: str):
    return parse_topo_matrix((DATA / name).read_text(), name)


def test_h100_nv18_between_every_pair_and_two_numa_nodes():
    matrix = parse(H100)
    labels = tuple(f"GPU{i}" for i in range(8))
    assert matrix.columns == labels
    assert matrix.nic_labels == ()
    for a, b in permutations(labels, 2):
        assert matrix.link(a, b) == GpuLink(TopologyLevel.NVLINK, 18)
    for label in labels:
        assert matrix.link(label, label) == GpuLink(TopologyLevel.SELF)
    for i, row in enumerate(matrix.rows):
        near = i < 4
        assert row.cpu_affinity == ((CpuRange(0, 51),) if near else (CpuRange(52, 103),))
        assert row.numa_affinity == ((CpuRange(0, 0),) if near else (CpuRange(1, 1),))
        assert row.gpu_numa_id is None  # no "GPU NUMA ID" column in this driver's output


@pytest.mark.parametrize(
    ("name", "link", "cpus"),
    [
        pytest.param(NV2, GpuLink(TopologyLevel.NVLINK, 2), CpuRange(0, 23), id="nv2-pair"),
        pytest.param(PHB, GpuLink(TopologyLevel.PHB), CpuRange(0, 11), id="phb-pair"),
    ],
)
def test_two_gpu_samples(name, link, cpus):
    matrix = parse(name)
    assert matrix.columns == ("GPU0", "GPU1")
    assert matrix.link("GPU0", "GPU1") == link
    assert matrix.link("GPU1", "GPU0") == link
    for row in matrix.rows:
        assert row.cpu_affinity == (cpus,)
        assert row.numa_affinity == ()  # N/A


# The layout nvidia-smi prints on a TTY with NICs (tabs, ANSI-underlined header, empty NIC
# affinity cells, legend), built here from the format described in nvml-fields.md.
NICS = (
    "\x1b[4m\tGPU0\tGPU1\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV12\tPXB\tSYS\t0-63,128-191\t0\t\tN/A\n"
    "GPU1\tNV12\t X \tSYS\tPIX\t64-127,192-255\t1\t\tN/A\n"
    "NIC0\tPXB\tSYS\t X \tSYS\n"
    "NIC1\tSYS\tPIX\tSYS\t X \n"
    "\n"
    "Legend:\n\n"
    "  X    = Self\n"
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n"
    "\n"
    "NIC Legend:\n\n"
    "  NIC0: mlx5_0\n"
    "  NIC1: mlx5_1\n"
)


def test_nics_tabs_ansi_and_legend():
    matrix = parse_topo_matrix(NICS, "nics.txt")
    assert matrix.columns == ("GPU0", "GPU1", "NIC0", "NIC1")
    assert matrix.gpu_labels == ("GPU0", "GPU1")
    assert matrix.nic_labels == ("NIC0", "NIC1")
    assert matrix.nic_names == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}
    assert matrix.link("GPU0", "GPU1") == GpuLink(TopologyLevel.NVLINK, 12)
    assert matrix.link("GPU0", "NIC0") == GpuLink(TopologyLevel.PXB)
    assert matrix.link("NIC1", "GPU1") == GpuLink(TopologyLevel.PIX)
    assert matrix.link("NIC0", "GPU1") == GpuLink(TopologyLevel.SYS)
    gpu0 = matrix.row("GPU0")
    assert gpu0 is not None
    assert gpu0.cpu_affinity == (CpuRange(0, 63), CpuRange(128, 191))
    assert gpu0.numa_affinity == (CpuRange(0, 0),)
    nic0 = matrix.row("NIC0")
    assert nic0 is not None and nic0.cpu_affinity == ()


def test_gpu_numa_id_and_na_cells():
    text = (
        "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        "GPU0\t X \tN/A\t0-71\t0\t2\n"
        "GPU1\tN/A\t X \t72-143\t1\t10\n"
    )
    matrix = parse_topo_matrix(text, "gh.txt")
    assert matrix.link("GPU0", "GPU1") is None
    assert [row.gpu_numa_id for row in matrix.rows] == [2, 10]


def test_older_drivers_name_nics_by_device():
    text = "\tGPU0\tmlx5_0\tCPU Affinity\nGPU0\t X \tPHB\t0-9\nmlx5_0\tPHB\t X \n"
    matrix = parse_topo_matrix(text, "old.txt")
    assert matrix.nic_labels == ("mlx5_0",)
    assert matrix.link("mlx5_0", "GPU0") == GpuLink(TopologyLevel.PHB)
    assert matrix.link("GPU0", "mlx5_0") == GpuLink(TopologyLevel.PHB)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "", "t.txt: empty topology: expected the `nvidia-smi topo -m` matrix", id="empty"
        ),
        pytest.param(
            "No devices were found\n",
            "t.txt:1: header 'No devices were found' does not start with GPU0:"
            " not `nvidia-smi topo -m` output",
            id="not-a-matrix",
        ),
        pytest.param(
            "\tGPU0\tGPU1\tCPU Affinity\n",
            "t.txt:1: the matrix has a header but no rows",
            id="header-only",
        ),
        pytest.param(
            "\tGPU0\tGPU1\nGPU0\t X \tNV\nGPU1\tNV\t X \n",
            "t.txt:2: row GPU0, column GPU1: 'NV' is not a topology cell"
            " (X, NV#, PIX, PXB, PHB, NODE, SYS)",
            id="nv-without-count",
        ),
        pytest.param(
            "\tGPU0\tGPU1\nGPU0\t X \tNV0\n",
            "t.txt:2: row GPU0, column GPU1: 'NV0': an NVLink bond has at least one link",
            id="nv-zero",
        ),
        pytest.param(
            "\tGPU0\tGPU1\nGPU0\t X \n",
            "t.txt:2: row GPU0 has 1 cells; expected 2 device cells and at most 0 affinity cells",
            id="short-row",
        ),
        pytest.param(
            "\tGPU0\tCPU Affinity\nGPU0\t X \t0-3\tspare\n",
            "t.txt:2: row GPU0 has 3 cells; expected 1 device cells and at most 1 affinity cells",
            id="long-row",
        ),
        pytest.param(
            "\tGPU0\tCPU Affinity\nGPU0\t X \t0-z\n",
            "t.txt:2: row GPU0: '0-z' is not a CPU list like 0-51,104-155",
            id="bad-cpu-list",
        ),
        pytest.param(
            "\tGPU0\nGPU7\t X \n", "t.txt:2: row GPU7 has no column in the header", id="unknown-row"
        ),
        pytest.param(
            "\tGPU0\tCPU Affinity\tGPU1\n",
            "t.txt:1: affinity columns must follow the device columns",
            id="column-order",
        ),
        pytest.param("\tGPU0\tGPU0\nGPU0\t X \t X\n", "t.txt:1: header repeats a column", id="dup"),
    ],
)
def test_broken_input(text, message):
    with pytest.raises(ParseError) as caught:
        parse_topo_matrix(text, "t.txt")
    assert str(caught.value) == message
