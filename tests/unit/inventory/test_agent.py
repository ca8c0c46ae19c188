"""gpualloc-agent end to end through main(): saved nvidia-smi output in, JSON out; and the exit
code and message where NVML is missing (this machine has no GPU)."""

from __future__ import annotations

import ctypes.util
import json
import sys
from pathlib import Path

import pytest

from services.inventory.adapters.sources.nvidia_smi_xml import parse_nvidia_smi_xml
from services.inventory.adapters.sources.report_json import from_json
from services.inventory.cli.agent import main

DATA = Path(__file__).parents[2] / "data"
A5000 = DATA / "nvidia-smi-xml" / "2x-rtx-a5000_drv590.44.01_telegraf.xml"
A100 = DATA / "nvidia-smi-xml" / "a100-sxm4-40gb_mig-2x3g.20gb_drv510.47.03_netdata.xml"
NV2 = DATA / "topo" / "2x-gpu_nv2_ml-engineering.txt"
HINT = "run on a GPU node with the NVIDIA driver, or use --xml FILE"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_xml_to_stdout(capsys):
    code, out, err = run(capsys, "--xml", str(A5000), "--stdout", "--node", "n1", "--label", "a=b")
    assert (code, err) == (0, "")
    report = from_json(json.loads(out))
    expected = parse_nvidia_smi_xml(A5000.read_text(), "n1", str(A5000), labels={"a": "b"})
    assert report == expected


def test_xml_with_topology(capsys):
    code, out, _ = run(capsys, "--xml", str(A5000), "--topo", str(NV2), "--stdout", "--once")
    assert code == 0
    data = json.loads(out)
    assert data["gpuLinks"] == [{"a": 0, "b": 1, "link": "NV2"}]
    assert data["gpus"][0]["nvlinkPeers"][0]["links"] == 2


def test_node_name_from_environment(capsys, monkeypatch):
    monkeypatch.setenv("NODE_NAME", "from-env")
    code, out, _ = run(capsys, "--xml", str(A5000), "--stdout")
    assert code == 0
    assert json.loads(out)["node"] == "from-env"


def test_nvml_package_missing(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    code, out, err = run(capsys, "--stdout", "--node", "n1")
    assert (code, out) == (1, "")
    assert err == (
        "gpualloc-agent: NVML not available: the nvidia-ml-py package is not installed"
        f" (pip install 'gpualloc[agent]'); {HINT}\n"
    )


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has the NVIDIA driver"
)
def test_nvml_driver_missing(capsys):
    pytest.importorskip("pynvml", reason="nvidia-ml-py is the `agent` extra")
    code, out, err = run(capsys, "--stdout", "--node", "n1")
    assert (code, out) == (1, "")
    assert err == f"gpualloc-agent: NVML not available: NVML Shared Library Not Found; {HINT}\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(
            ["--xml", "/nonexistent/smi.xml", "--stdout"],
            "cannot read /nonexistent/smi.xml: [Errno 2] No such file or directory:"
            " '/nonexistent/smi.xml'",
            id="missing-file",
        ),
        pytest.param(
            ["--xml", str(NV2), "--stdout"],
            f"{NV2}:1: not well-formed XML: syntax error",
            id="not-xml",
        ),
        pytest.param(
            ["--xml", str(A100), "--topo", str(NV2), "--stdout"],
            "topology: GPU1 is not in the report (GPU indexes [0])",
            id="topology-of-another-node",
        ),
        pytest.param(
            ["--xml", str(A5000), "--topo", str(A5000), "--stdout"],
            f"{A5000}:1: header '<?xml version=\"1.0\" ?>' does not start with GPU0:"
            " not `nvidia-smi topo -m` output",
            id="topology-not-a-matrix",
        ),
    ],
)
def test_failures_exit_1_with_a_message(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert (code, out) == (1, "")
    assert err == f"gpualloc-agent: {message}\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--xml", str(A5000)], "nothing to do: pass --stdout", id="no-output"),
        pytest.param(
            ["--stdout", "--label", "novalue"], "--label 'novalue' is not KEY=VALUE", id="label"
        ),
        pytest.param(["--stdout", "--interval", "0"], "--interval must be positive", id="interval"),
    ],
)
def test_bad_flags_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    assert message in capsys.readouterr().err
