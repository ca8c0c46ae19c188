"""The Slurm bridge and the load runner over mutual TLS against a server with an AccessPolicy:
the bridge's certificate acts for `slurm/job/<id>` inside its tenant, and nobody else can."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from loadtest.ghzlike import cli as load_cli
from protos.allocator.v1 import allocator_pb2 as pb
from protos.allocator.v1 import allocator_pb2_grpc
from services.bridges.slurm import cli as slurm_cli
from tests.integration.test_bridges_slurm import exports
from tests.security_fixtures import SecuredFleet, secured_fleet

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredFleet]:
    with secured_fleet(tmp_path_factory.mktemp("pki-bridges")) as made:
        yield made


def slurm(fleet: SecuredFleet, who: str, *argv: str, **environ: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = slurm_cli.main(list(argv), {**fleet.client_environ(who), **environ}, out, err)
    return code, out.getvalue(), err.getvalue()


JOB = {"SLURM_JOB_ID": "4242", "SLURMD_NODENAME": "h100-node-1", "SLURM_JOB_GRES": "gpu:h100:2"}


def test_the_slurm_bridge_reserves_as_its_tenant_and_releases_over_mtls(fleet: SecuredFleet):
    code, out, err = slurm(fleet, "slurm-bridge", "prolog", **JOB)
    assert code == 0, err
    assert len(exports(out)["CUDA_VISIBLE_DEVICES"].split(",")) == 2
    admin = allocator_pb2_grpc.AllocatorStub(fleet.channel("admin"))
    listed = admin.ListReservations(pb.ListReservationsRequest(), timeout=10).reservations
    (held,) = [r for r in listed if r.owner == "hpc/slurm/job/4242"]
    assert held.tenant == "hpc" and held.state == pb.RESERVATION_STATE_RESERVED  # sync renews
    # another tenant's scheduler naming the same job cannot end it
    other = allocator_pb2_grpc.AllocatorStub(fleet.channel("scheduler-a"))
    with pytest.raises(grpc.RpcError) as caught:
        other.Release(
            pb.ReleaseRequest(reservation_id=held.id, owner="slurm/job/4242"),
            metadata=(("x-gpualloc-owner", "slurm/job/4242"),),
            timeout=10,
        )
    assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
    code, _, err = slurm(fleet, "slurm-bridge", "epilog", **JOB)
    assert code == 0, err
    listed = admin.ListReservations(pb.ListReservationsRequest(), timeout=10).reservations
    assert not [r for r in listed if r.owner == "hpc/slurm/job/4242"]


def test_a_bridge_certificate_of_another_tenant_cannot_run_the_prolog_for_slurm_jobs(
    fleet: SecuredFleet,
):
    code, _, err = slurm(fleet, "scheduler-a", "prolog", **{**JOB, "SLURM_JOB_ID": "4343"})
    assert code != 0
    assert "may not act for owner" in err


def load(fleet: SecuredFleet, who: str, tmp_path: Path, **run: object) -> tuple[int, Any]:
    """gpualloc-load (ghz's flags) against the mTLS port with `who`'s certificate; `run` is
    the config (call, total, concurrency, data). Returns the exit code and the JSON report."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"host": "unused:1", **run}))
    report = tmp_path / "report.json"
    directory = fleet.directory / who
    argv = [
        f"127.0.0.1:{fleet.mtls_port}", "--config", str(config), "--no-progress",
        "-O", "json", "-o", str(report),
        "--cacert", str(fleet.directory / "ca.crt"),
        "--cert", str(directory / "tls.crt"), "--key", str(directory / "tls.key"),
    ]  # fmt: skip
    code = load_cli.main(argv)
    return code, json.loads(report.read_text())


def test_the_load_runner_over_mtls_as_a_scheduler(fleet: SecuredFleet, tmp_path: Path):
    claim = {
        "name": "c",
        "requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
    }
    code, written = load(
        fleet, "scheduler-a", tmp_path, call="gpualloc.allocator.v1.Allocator/Capacity",
        total=20, concurrency=2, data={"claims": [claim]},
    )  # fmt: skip
    assert code == 0
    assert written["count"] == 20 and not written.get("errorDistribution")
    assert written["statusCodeDistribution"] == {"OK": 20}


def test_the_load_runner_sees_permission_denied_for_an_agent(fleet: SecuredFleet, tmp_path: Path):
    _, written = load(
        fleet, "agent", tmp_path, call="gpualloc.allocator.v1.Allocator/Explain",
        total=4, concurrency=1, data={"claims": []},
    )  # fmt: skip
    assert written["statusCodeDistribution"] == {"PermissionDenied": 4}
