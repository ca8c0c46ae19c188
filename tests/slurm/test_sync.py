"""`gpualloc-slurm sync` under a real slurmctld and slurmd (tests/slurm/conftest.py): GPUs
another owner holds are kept from Slurm by holder jobs, and the leases of running jobs are
renewed, so a lost epilog frees the GPUs by itself."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest

from services.bridges.slurm.claims import pinned_claim
from services.client import AllocatorClient, ReservationState
from services.client.inventory import InventoryClient
from tests.slurm.conftest import NODE, RELEASE_SLOT, SlurmCluster
from tests.slurm.test_real_slurm import (
    OTHER_OWNER,
    assert_agree,
    assert_node_not_drained,
    held_devices,
    hold,
    holder_jobs,
    ids,
    lines,
    release_owner,
    report,
    wait_for_holders,
    wait_released,
)


def hold_devices(slurm: SlurmCluster, devices: Sequence[str], node: str = NODE) -> None:
    """Another system holds exactly these devices of the node (pinned by UUID)."""
    with InventoryClient(slurm.target) as inventory:
        found = inventory.node(node, topology=False)
        assert found is not None
        picked = [d for d in found.devices if d.id.device in devices]
    claim = pinned_claim("train", picked)
    with AllocatorClient(slurm.target) as client:
        placement = client.allocate(
            [claim], node_name=node, reserve=True, owner=OTHER_OWNER, idempotency_key="train"
        )
        assert placement.fits
        for reservation in placement.reservations:
            client.commit(reservation, owner=OTHER_OWNER)


def test_gpus_another_owner_holds_are_never_offered_by_slurm(slurm):
    hold_devices(slurm, ["gpu-3", "gpu-6"])  # not Slurm's first picks (it starts at 0)
    with slurm.syncing("--interval=0.5s") as sync:
        began = time.monotonic()
        holders = wait_for_holders(slurm, [3, 6])
        print(f"holders on 3,6 after {time.monotonic() - began:.1f}s")
        comments = {slurm.job(j)["Comment"] for j in holders}
        assert comments == {f"gpualloc: gpu-{i} held by {OTHER_OWNER}" for i in (3, 6)}

        # gpualloc unreachable: sync's passes fail and are retried; the holders stay (Slurm
        # keeps off those GPUs rather than risk them), nothing is drained
        slurm.proxy.down()
        time.sleep(3)
        assert sync.poll() is None and holder_jobs(slurm) == holders, slurm.log_tail(60)
        assert "sync pass failed: Unavailable" in (slurm.directory / "log/sync.log").read_text()
        slurm.proxy.up()

        # a job asking for all the rest gets exactly the six free GPUs, at once
        job_id = slurm.sbatch("--gres=gpu:6", script=f"{report(slurm)} batch\n{hold(slurm)}\n")
        slurm.wait_for_file(slurm.out / f"ready-{job_id}")
        assert held_devices(slurm, job_id) == [f"gpu-{i}" for i in (0, 1, 2, 4, 5, 7)]
        (slurm.out / f"go-{job_id}").touch()
        assert slurm.wait_for(job_id, ["COMPLETED", "FAILED"])["JobState"] == "COMPLETED"
        task = lines((slurm.out / f"{job_id}.out").read_text())["batch"]
        assert ids(task["JOB_GPUS"]) == [0, 1, 2, 4, 5, 7]
        assert_agree(slurm, task, [0, 1, 2, 4, 5, 7])
        assert slurm.job(job_id)["Restarts"] == "0"
        wait_released(slurm, job_id)

        # a job asking for more than is free waits for resources: never started, never
        # requeued, no node drained, nothing reserved for it
        big = slurm.sbatch("--gres=gpu:7", script=f"{report(slurm)} batch\n")
        time.sleep(5)
        fields = slurm.job(big)
        assert (fields["JobState"], fields["Reason"], fields["Restarts"]) == (
            "PENDING",
            "Resources",
            "0",
        ), fields
        assert_node_not_drained(slurm)
        assert slurm.reservations(owner=f"slurm/job/{big}") == []

        # the other owner lets go: the holders go and Slurm offers those GPUs again
        release_owner(slurm, OTHER_OWNER)
        released = time.monotonic()
        done = slurm.wait_for(big, ["COMPLETED", "FAILED"])
        took = time.monotonic() - released
        print(f"GPUs offered again: job {big} completed {took:.1f}s after the release")
        assert done["JobState"] == "COMPLETED" and done["Restarts"] == "0", done
        task = lines((slurm.out / f"{big}.out").read_text())["batch"]
        assert {3, 6} <= set(ids(task["JOB_GPUS"])) and len(ids(task["JOB_GPUS"])) == 7
        assert_agree(slurm, task, ids(task["JOB_GPUS"]))
        assert holder_jobs(slurm) == {}
        wait_released(slurm, big)
    assert_node_not_drained(slurm)


LEASE = 3.0


@pytest.mark.parametrize("sync_survives", [True, False], ids=["sync-sweeps", "lease-expires"])
def test_a_lost_epilog_does_not_leak_the_reservation(slurm, sync_survives):
    lost = "#!/bin/sh\nexit 0\n"  # the job's release never tells gpualloc (a crash, say)
    with (
        slurm.hook_settings(GPUALLOC_SLURM_LEASE=f"{LEASE:g}s"),
        slurm.script(RELEASE_SLOT, lost),
        slurm.syncing("--interval=0.5s", GPUALLOC_SLURM_LEASE=f"{LEASE:g}s") as sync,
    ):
        job_id = slurm.sbatch("--gres=gpu:2", script=f"{hold(slurm)}\n")
        slurm.wait_for_file(slurm.out / f"ready-{job_id}")
        (first,) = slurm.reservations(owner=f"slurm/job/{job_id}")
        assert first.state is ReservationState.RESERVED and first.expires_at is not None
        time.sleep(2 * LEASE)  # longer than the lease: the running job keeps it, renewed
        (renewed,) = slurm.reservations(owner=f"slurm/job/{job_id}")
        assert renewed.id == first.id and renewed.devices == first.devices
        assert renewed.expires_at is not None and renewed.expires_at > first.expires_at
        if not sync_survives:
            sync.terminate()  # the controller's service is gone too
            sync.wait(timeout=30)
        ended = time.monotonic()
        (slurm.out / f"go-{job_id}").touch()
        assert slurm.wait_for(job_id, ["COMPLETED"])["JobState"] == "COMPLETED"
        wait_released(slurm, job_id, timeout=LEASE + 10)
        freed_after = time.monotonic() - ended
    print(f"lost epilog, sync {'running' if sync_survives else 'stopped'}: "
          f"GPUs back {freed_after:.1f}s after the job ended (lease {LEASE:g}s)")  # fmt: skip
    assert_node_not_drained(slurm)
