"""Which reservations `gpualloc-slurm sync` keeps Slurm away from: everything but this
cluster's own Slurm jobs (services/bridges/slurm/sync.py); tests/slurm/test_sync.py runs the
holder jobs under a real Slurm."""

from __future__ import annotations

import pytest

from services.bridges.slurm.sync import is_holder, outside_holdings
from services.client.results import Reservation, ReservationState
from services.common.dra.model import DeviceID

NODE = "h100-node-1"


def held(owner: str, *devices: str, cluster: str | None = None) -> Reservation:
    labels = {"slurm.cluster": cluster} if cluster is not None else {}
    return Reservation(
        id=f"r-{owner}",
        owner=owner,
        node_name=NODE,
        state=ReservationState.COMMITTED,
        devices=tuple(DeviceID("gpu.nvidia.com", NODE, d) for d in devices),
        labels=labels,
    )


@pytest.mark.parametrize(
    ("reservation", "outside"),
    [
        pytest.param(held("kueue/team-a/train", "gpu-3", "gpu-6"),
                     {"gpu-3": "kueue/team-a/train", "gpu-6": "kueue/team-a/train"},
                     id="a-kueue-workload-is-outside"),
        pytest.param(held("slurm/job/7", "gpu-0", cluster="c1"), {},
                     id="this-clusters-job-is-ours"),
        pytest.param(held("slurm/job/7", "gpu-0"), {}, id="an-unlabelled-slurm-job-is-ours"),
        pytest.param(held("hpc/slurm/job/7", "gpu-0", cluster="c1"), {},
                     id="a-job-listed-with-its-tenant-is-ours"),
        pytest.param(held("slurm/job/7", "gpu-1", cluster="c2"), {"gpu-1": "slurm/job/7"},
                     id="another-clusters-job-is-outside"),
        pytest.param(held("", "gpu-2"), {"gpu-2": "another tenant"},
                     id="another-tenants-hidden-owner-is-outside"),
        pytest.param(held("team-a/notebook", "gpu-5"), {"gpu-5": "team-a/notebook"},
                     id="a-reservation-by-hand-is-outside"),
    ],
)  # fmt: skip
def test_outside_holdings(reservation, outside):
    # under an access policy the server lists owners as <tenant>/<name>: the bridge's own jobs
    # must still be its own, or sync would hold their GPUs away from themselves
    expected = {NODE: outside} if outside else {}
    assert outside_holdings([reservation], "c1") == expected


@pytest.mark.parametrize(
    ("environ", "holder"),
    [
        pytest.param({"SLURM_JOB_NAME": "gpualloc-held", "SLURM_JOB_UID": "0"}, True, id="roots"),
        pytest.param({"SLURM_JOB_NAME": "gpualloc-held", "SLURM_JOB_UID": "1000"}, False,
                     id="a-users-job-of-that-name"),
        pytest.param({"SLURM_JOB_NAME": "train", "SLURM_JOB_UID": "0"}, False,
                     id="roots-other-job"),
        pytest.param({"SLURM_JOB_NAME": "gpualloc-held"}, False, id="no-uid"),
    ],
)  # fmt: skip
def test_is_holder(environ, holder):
    assert is_holder(environ) is holder
