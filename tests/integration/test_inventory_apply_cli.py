"""`gpualloc apply` against a real inventory server on port 0: kubectl-style lines, dry runs,
reports, the server's field path on INVALID_ARGUMENT (exit 2), an unreachable server (exit 1)."""

from __future__ import annotations

import argparse
import io
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from services.inventory.app.service import InventoryService
from services.inventory.bootstrap import InventoryApp, build_inventory
from services.inventory.cli import apply as apply_cli

DATA = Path(__file__).resolve().parents[1] / "data"
T4_SLICE = DATA / "resourceslices" / "openshift-v1.35_2x-tesla-t4_condensed.yaml"
SLICE_NAME = "harpatil4220c-g9kfm-gpu-c-rd8r8-gpu.nvidia.com-wvrlc"
A5000_XML = DATA / "nvidia-smi-xml" / "2x-rtx-a5000_drv590.44.01_telegraf.xml"
NODES = "apiVersion: v1\nkind: Node\nmetadata: {name: n1, labels: {zone: a}}\n"

Server = tuple[InventoryApp, str]


@pytest.fixture
def start(grpc_channel_factory) -> Iterator[Callable[..., Server]]:
    apps: list[InventoryApp] = []

    def serve(service: InventoryService | None = None) -> Server:
        app = build_inventory(service)
        apps.append(app)
        return app, grpc_channel_factory([app.registration]).target

    yield serve
    for app in apps:
        app.service.close()


def apply(*args: str, stdin: str = "") -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    apply_cli.register(parser.add_subparsers())
    parsed = parser.parse_args(["apply", *args])
    address = parsed.inventory or "127.0.0.1:1"
    out, err = io.StringIO(), io.StringIO()
    code = apply_cli.run_apply(
        parsed.filename,
        address,
        node=parsed.node,
        dry_run=parsed.dry_run,
        stdin=io.StringIO(stdin),
        stdout=out,
        stderr=err,
    )
    return code, out.getvalue(), err.getvalue()


def test_apply_prints_configured_then_unchanged(start) -> None:
    app, address = start()
    code, out, _ = apply("-f", str(T4_SLICE), "-f", "-", "--inventory", address, stdin=NODES)
    assert code == 0
    assert out.splitlines() == ["node/n1 configured", f"resourceslice/{SLICE_NAME} configured"]
    assert app.service.generation == 1
    code, out, _ = apply("-f", str(T4_SLICE), "--inventory", address)
    assert (code, out) == (0, f"resourceslice/{SLICE_NAME} unchanged\n")
    code, out, _ = apply("-f", str(T4_SLICE), "-f", "-", "--inventory", address, stdin=NODES)
    assert out.splitlines() == ["node/n1 unchanged", f"resourceslice/{SLICE_NAME} unchanged"]
    relabelled = NODES.replace("zone: a", "zone: b")
    assert relabelled != NODES
    code, out, _ = apply("-f", "-", "--inventory", address, stdin=relabelled)
    assert out.splitlines() == ["node/n1 configured"]


def test_a_dry_run_changes_nothing(start) -> None:
    app, address = start()
    code, out, _ = apply("-f", str(T4_SLICE), "--dry-run", "--inventory", address)
    assert (code, out) == (0, f"resourceslice/{SLICE_NAME} configured (dry run)\n")
    assert app.service.generation == 0


def test_xml_with_a_node_is_sent_as_a_report_to_the_env_address(
    start, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    app, address = start()
    monkeypatch.setenv(apply_cli.ENV_ADDRESS, address)
    parser = argparse.ArgumentParser()
    apply_cli.register(parser.add_subparsers())
    parsed = parser.parse_args(["apply", "-f", str(A5000_XML), "--node", "n1"])
    assert parsed.func(parsed) == 0
    assert capsys.readouterr().out == (
        "nodereport/n1 configured (generation 1: 0 matched, 2 synthesized, 0 tainted)\n"
    )
    view = app.service.snapshot().view("n1")
    assert view is not None and len(view.synthesized) == 2


def test_a_report_reapplied_with_the_same_facts_prints_unchanged(start, tmp_path: Path) -> None:
    """The second apply only refreshes the report's TTL: no new generation, `unchanged`; a
    report whose facts differ (here the driver version) is configured again."""
    app, address = start()
    first = "nodereport/n1 configured (generation 1: 0 matched, 2 synthesized, 0 tainted)"
    again = "nodereport/n1 unchanged (generation 1: 0 matched, 2 synthesized, 0 tainted)"
    code, out, _ = apply("-f", str(A5000_XML), "--node", "n1", "--inventory", address)
    assert (code, out.splitlines()) == (0, [first])
    code, out, _ = apply("-f", str(A5000_XML), "--node", "n1", "--inventory", address)
    assert (code, out.splitlines()) == (0, [again])
    assert app.service.generation == 1
    newer = tmp_path / "newer-driver.xml"
    newer.write_text(A5000_XML.read_text().replace("590.44.01", "590.48.01"))
    code, out, _ = apply("-f", str(newer), "--node", "n1", "--inventory", address)
    assert (code, out.splitlines()) == (
        0,
        ["nodereport/n1 configured (generation 2: 0 matched, 2 synthesized, 0 tainted)"],
    )


def test_the_servers_invalid_argument_exits_2_with_its_field_path(start) -> None:
    app, address = start(InventoryService(max_objects_per_apply=1))
    code, out, err = apply("-f", str(T4_SLICE), "-f", "-", "--inventory", address, stdin=NODES)
    assert (code, out) == (2, "")
    assert "rejected by the inventory: slices: at most 1 slices and nodes" in err
    assert app.service.generation == 0


def test_invalid_input_exits_2_before_anything_is_sent(start, tmp_path: Path) -> None:
    app, address = start()
    bad = tmp_path / "bad.yaml"
    bad.write_text(T4_SLICE.read_text().replace("15Gi", "15XB", 1))
    code, _, err = apply("-f", str(T4_SLICE), "-f", str(bad), "--inventory", address)
    assert code == 2 and "bad.yaml" in err and 'capacity["memory"]' in err
    assert app.service.generation == 0


def test_an_unreachable_inventory_exits_1() -> None:
    code, out, err = apply("-f", str(T4_SLICE), "--inventory", "127.0.0.1:1")
    assert (code, out) == (1, "")
    assert "cannot reach the inventory at 127.0.0.1:1" in err


def test_a_topology_file_hangs_on_the_slices_the_inventory_holds(start, tmp_path: Path) -> None:
    app, address = start()
    assert apply("-f", str(T4_SLICE), "--inventory", address)[0] == 0
    node = "harpatil4220c-g9kfm-gpu-c-rd8r8"
    topo = tmp_path / f"{node}.topo.txt"
    topo.write_text((DATA / "topo" / "2x-gpu_phb-no-nvlink_ml-engineering.txt").read_text())
    code, out, _ = apply("-f", str(topo), "--inventory", address)
    assert (code, out) == (
        0,
        f"nodereport/{node} configured (generation 2: 2 matched, 0 synthesized, 0 tainted)\n",
    )
    view = app.service.snapshot().view(node)
    assert view is not None and view.topology is not None
    assert [e.relation.value for e in view.topology.pcie] == ["PHB"]
