"""What the long-running Slurm hooks service keeps (services/bridges/slurm/batching.py): the
prologs of one moment reserved in one AllocateBatch, the inventory read from a warm copy; and a
release that races a prolog's Allocate (services/bridges/placing.py), all against the
project's gpualloc server. tests/slurm runs the same through a real Slurm."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import grpc
import pytest

from services.bridges import local_cluster
from services.bridges.placing import Placer
from services.bridges.slurm import cli
from services.bridges.slurm.batching import AllocateBatcher, BatchingClient, WarmInventory
from services.bridges.slurm.claims import pinned_claim
from services.bridges.slurm.prolog import slurm_devices
from services.client import AllocatorClient
from services.client.client import AllocateItem
from services.client.config import ClientSettings
from services.client.inventory import InventoryClient
from services.client.results import Placement, Reservation
from services.common.errors import InvalidArgument, Unavailable
from services.common.grpc_errors import RemoteError
from tests.unit.bridges.support import release_everything

NODE = "h100-node-1"


@pytest.fixture(scope="module")
def gpualloc() -> Iterator[str]:
    with local_cluster.start() as started:
        yield started.target


@pytest.fixture
def client(gpualloc: str) -> Iterator[AllocatorClient]:
    release_everything(gpualloc)
    with AllocatorClient(gpualloc) as opened:
        yield opened
    release_everything(gpualloc)


def job_item(
    client: AllocatorClient, job: int, ids: Sequence[int], node_name: str = NODE
) -> AllocateItem:
    """A prolog's reservation of Slurm's GPU ids `ids` on a node for job `job`."""
    with InventoryClient(client.target) as inventory:
        node = inventory.node(node_name, topology=False)
    assert node is not None
    return AllocateItem(
        [pinned_claim(str(job), slurm_devices(node, ids))],
        node_name=node_name,
        reserve=True,
        owner=f"slurm/job/{job}",
        idempotency_key=f"slurm-{job}-{node_name}",
        lease_ttl_seconds=600,
    )


def held(placement: Placement) -> list[str]:
    return sorted(d.device for r in placement.reservations for d in r.devices)


def reserve(
    client: AllocatorClient, job: int, node: str, cluster: str, gpu: int = 0
) -> Reservation:
    """What job `job` of `cluster` holds: GPU id `gpu` of `node`."""
    item = job_item(client, job, [gpu], node)
    placement = client.allocate(
        item.claims,
        node_name=node,
        reserve=True,
        owner=item.owner,
        idempotency_key=item.idempotency_key,
        lease_ttl_seconds=600,
        labels={"slurm.job_id": str(job), "slurm.cluster": cluster},
    )
    (reservation,) = placement.reservations
    return reservation


class CountingClient(AllocatorClient):
    """The real client, counting its calls; `first_call_starts` lets a test hold the first
    call until more callers queued behind it."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.batch_sizes: list[int] = []
        self.singles = 0
        self.first_call_starts = threading.Event()
        self.go_on = threading.Event()
        self.go_on.set()

    def allocate_many(self, items):
        self.batch_sizes.append(len(items))
        self.first_call_starts.set()
        self.go_on.wait(10)
        return super().allocate_many(items)

    def allocate(self, claims, **options):
        self.singles += 1
        self.first_call_starts.set()
        self.go_on.wait(10)
        return super().allocate(claims, **options)


def test_prologs_that_come_together_go_in_one_allocate_batch(client):
    counting = CountingClient(client.target)
    batcher = AllocateBatcher(counting)
    counting.go_on.clear()  # the first prolog's call waits while five more arrive
    results: dict[int, Placement] = {}

    def prolog(job: int) -> None:
        results[job] = batcher.allocate(job_item(client, job, [job]))

    first = threading.Thread(target=prolog, args=(0,))
    first.start()
    assert counting.first_call_starts.wait(10)
    others = [threading.Thread(target=prolog, args=(j,)) for j in range(1, 6)]
    for thread in others:
        thread.start()
    while len(batcher._queue) < 5:  # noqa: SLF001 - until all five wait behind the first
        threading.Event().wait(0.01)
    counting.go_on.set()
    for thread in [first, *others]:
        thread.join(10)
    assert counting.singles == 1 and counting.batch_sizes == [5]  # 6 prologs, 2 round trips
    assert {job: held(p) for job, p in results.items()} == {j: [f"gpu-{j}"] for j in range(6)}
    owners = {r.owner for p in results.values() for r in p.reservations}
    assert owners == {f"slurm/job/{j}" for j in range(6)}


def test_a_wave_in_the_service_goes_in_one_call(client):
    # three prologs in the service at once (`arriving`: reading Slurm's ids); the first to
    # reserve waits for the two others, not a fixed time
    counting = CountingClient(client.target)
    batcher = AllocateBatcher(counting, gather_seconds=30)  # bounded far beyond any machine
    results: dict[int, Placement] = {}
    inside = threading.Barrier(3)

    def prolog(job: int) -> None:
        with batcher.arriving():
            inside.wait(10)
            results[job] = batcher.allocate(job_item(client, job, [job]))

    threads = [threading.Thread(target=prolog, args=(job,)) for job in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert counting.singles == 0 and counting.batch_sizes == [3]
    assert {job: held(p) for job, p in results.items()} == {j: [f"gpu-{j}"] for j in range(3)}


@pytest.mark.parametrize("reserves", [True, False], ids=["reserves", "asks-for-no-gpu"])
def test_a_prolog_alone_in_the_service_waits_for_nobody(client, reserves):
    # a job that starts alone is sent at once: with a gather time of 60 s the prolog is done
    # long before it. One that reserves nothing (no GPU asked, or it failed before) stops
    # counting as coming when it leaves, so the next prolog does not wait for it either.
    counting = CountingClient(client.target)
    batcher = AllocateBatcher(counting, gather_seconds=60)
    with batcher.arriving():
        if reserves:
            assert held(batcher.allocate(job_item(client, 1, [1]))) == ["gpu-1"]
    done = threading.Event()

    def prolog() -> None:
        with batcher.arriving():
            batcher.allocate(job_item(client, 2, [2]))
        done.set()

    threading.Thread(target=prolog, daemon=True).start()
    assert done.wait(30)
    assert counting.batch_sizes == [] and counting.singles == (2 if reserves else 1)


def test_an_item_that_fails_fails_its_prolog_alone(client):
    batcher = AllocateBatcher(client)
    good = job_item(client, 10, [0])
    bad = AllocateItem([], node_name=NODE, reserve=True, owner="slurm/job/11",
                       idempotency_key="slurm-11-x", lease_ttl_seconds=600)  # fmt: skip
    placed, refused = batcher._send([good, bad])  # noqa: SLF001 - one AllocateBatch
    assert isinstance(placed, Placement)
    assert held(placed) == ["gpu-0"]
    assert isinstance(refused, InvalidArgument), refused
    with pytest.raises(InvalidArgument):  # raised in the prolog's own thread
        batcher.allocate(bad)


class NoBatches(AllocatorClient):
    """An allocator from before AllocateBatch: UNIMPLEMENTED."""

    def allocate_many(self, items):
        raise RemoteError(grpc.StatusCode.UNIMPLEMENTED, "unknown method AllocateBatch")


def test_an_allocator_without_allocate_batch_gets_one_allocate_per_prolog(client):
    batcher = AllocateBatcher(NoBatches(client.target))
    items = [job_item(client, 20 + i, [i]) for i in range(2)]
    placed = batcher._send(items)  # noqa: SLF001
    assert [held(p) if isinstance(p, Placement) else p for p in placed] == [["gpu-0"], ["gpu-1"]]
    assert not batcher._batch_call  # noqa: SLF001 - and it does not ask again


class Broken(AllocatorClient):
    def allocate(self, claims, **options):
        raise RuntimeError("a bug")


def test_a_bug_in_the_call_fails_its_prologs_and_leaves_none_waiting(client):
    batcher = AllocateBatcher(Broken(client.target))
    with pytest.raises(RuntimeError):
        batcher.allocate(job_item(client, 30, [0]))
    assert not batcher._busy and batcher._queue == []  # noqa: SLF001 - the next prolog goes


def test_the_hooks_client_sends_reserving_allocates_through_the_batcher(client):
    batcher = AllocateBatcher(CountingClient(client.target))
    hooks_client = BatchingClient(batcher, owner="slurm/job/40")
    item = job_item(client, 40, [3])
    placement = hooks_client.allocate(
        item.claims, node_name=NODE, reserve=True, idempotency_key=item.idempotency_key
    )
    assert held(placement) == ["gpu-3"] and placement.reservations[0].owner == "slurm/job/40"
    assert batcher.batches == 1
    hooks_client.allocate(item.claims, node_name=NODE)  # a read: the client's own call
    assert batcher.batches == 1


def test_the_warm_inventory_reads_a_node_once_per_max_age(gpualloc):
    now = [0.0]
    inventory = WarmInventory(gpualloc, max_age=10.0, clock=lambda: now[0])
    try:
        first = inventory.node(NODE, topology=False)
        assert inventory.node(NODE, topology=False) == first and inventory.reads == 1
        now[0] = 10.5
        assert inventory.node(NODE, topology=False) == first and inventory.reads == 2
        inventory.nodes()
        inventory.nodes()
        assert inventory.reads == 3
        assert inventory.node("no-such-node") is None  # not found: not kept, asked again
        inventory.forget()
        inventory.node(NODE, topology=False)
        assert inventory.reads == 4
    finally:
        inventory.close()


class ReleasingExplain(AllocatorClient):
    """Explain, with the blocking reservation released just before it is asked (the finished
    job's release landing between the next prolog's Allocate and its Explain)."""

    def __init__(self, target: str, blocking: Reservation) -> None:
        super().__init__(target)
        self.blocking: Reservation | None = blocking

    def explain(self, claims, **options):
        if self.blocking is not None:
            self.release(self.blocking, owner=self.blocking.owner)
            self.blocking = None
        return super().explain(claims, **options)


def test_a_release_between_allocate_and_explain_still_reserves(client):
    # Before: Explain answered "fits" (the GPU was free by then), the Placer returned it, and
    # the prolog found no reservation (exit 4: the job requeued without a reason). Now the
    # Allocate is made again.
    ended = reserve(client, 50, NODE, "c1", gpu=2)
    racing = ReleasingExplain(client.target, ended)
    item = job_item(client, 51, [2])
    with InventoryClient(client.target) as inventory:
        placement = Placer(racing, inventory).allocate(
            item.claims, owner="slurm/job/51", idempotency_key=item.idempotency_key,
            node_name=NODE, lease_ttl_seconds=600,
        )  # fmt: skip
    assert placement.fits and held(placement) == ["gpu-2"]
    assert placement.reservations[0].owner == "slurm/job/51"


# --- the service's epilogs: one List per batch, this cluster's reservations only ------------


@pytest.fixture
def hooks(client: AllocatorClient) -> Iterator[cli._Hooks]:  # noqa: SLF001
    env = {"GPUALLOC_ALLOCATOR_ADDR": client.target, "SLURM_CONF": "/nonexistent"}
    with WarmInventory(client.target) as inventory:
        served = cli._Hooks(  # noqa: SLF001 - the service's handler, without its socket
            env, ClientSettings.from_env(env), client, inventory, [], lambda: "c1", sweeps=False
        )
        try:
            yield served
        finally:
            served.close()


@pytest.mark.parametrize(
    ("job_env", "released"),
    [
        pytest.param({"SLURM_CLUSTER_NAME": "c1"}, ["c1"], id="epilog-slurmctld-names-it"),
        pytest.param({}, ["c1"], id="jobcomp-without-accounting-the-services-cluster"),
        pytest.param({"SLURM_CLUSTER_NAME": "c2"}, ["c2"], id="another-clusters-job"),
    ],
)
def test_an_epilog_releases_its_clusters_job_only(client, hooks, job_env, released):
    # two Slurm clusters sharing the allocator, each with a job 70 on a node of its own
    reserve(client, 70, NODE, "c1")
    reserve(client, 70, "h100-node-2", "c2")
    answer = hooks.answer(["epilog", "--all-nodes"], {"SLURM_JOB_ID": "70", **job_env}, 0)
    assert answer.code == 0 and "release queued" in answer.stderr
    assert hooks.releases.wait_for_queued(10)
    left = sorted(r.labels["slurm.cluster"] for r in client.list())
    assert left == sorted({"c1", "c2"} - set(released))


PICKS = {"81": "1-2", "83": "3-4", "85": "5"}
"""Slurm's GPU ids of three jobs that start together."""


def test_prologs_through_the_service_reserve_exactly_slurms_pick(client, hooks):
    hooks.details.show = lambda job_id: (
        f"JobId={job_id}\n   Nodes={NODE} CPU_IDs=0 Mem=0 GRES=gpu:h100:2(IDX:{PICKS[job_id]})\n"
    )
    answers = {}

    def prolog(job: str) -> None:
        env = {"SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": NODE, "SLURM_CLUSTER_NAME": "c1",
               "SLURM_SCRIPT_CONTEXT": "prolog_slurmctld"}  # fmt: skip
        answers[job] = hooks.answer(["prolog"], env, 0)

    threads = [threading.Thread(target=prolog, args=(job,)) for job in PICKS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert all(a.code == 0 for a in answers.values()), answers
    held_by = {r.owner: sorted(d.device for d in r.devices) for r in client.list()}
    assert held_by == {
        "slurm/job/81": ["gpu-1", "gpu-2"],
        "slurm/job/83": ["gpu-3", "gpu-4"],
        "slurm/job/85": ["gpu-5"],
    }
    assert 1 <= hooks.batcher.batches <= 3


class CountingLists(AllocatorClient):
    lists = 0

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.nodes: list[str] = []

    def list(self, *args, **options):
        self.lists += 1
        self.nodes.append(options.get("node_name", ""))
        return super().list(*args, **options)


def test_a_job_this_service_reserved_is_released_without_listing(client):
    counting = CountingLists(client.target)
    env = {"GPUALLOC_ALLOCATOR_ADDR": client.target, "SLURM_CONF": "/nonexistent"}
    inventory = WarmInventory(client.target)
    served = cli._Hooks(  # noqa: SLF001
        env, ClientSettings.from_env(env), counting, inventory, [], lambda: "c1", sweeps=False
    )
    try:
        served.details.show = lambda job_id: (  # type: ignore[method-assign]
            f"JobId={job_id}\n   Nodes={NODE} CPU_IDs=0 Mem=0 GRES=gpu:h100:1(IDX:4)\n"
        )
        job = {"SLURM_JOB_ID": "90", "SLURM_JOB_NODELIST": NODE, "SLURM_CLUSTER_NAME": "c1",
               "SLURM_SCRIPT_CONTEXT": "prolog_slurmctld"}  # fmt: skip
        assert served.answer(["prolog"], job, 0).code == 0
        reserve(client, 91, NODE, "c1", gpu=5)  # reserved elsewhere (the command, say)
        lists = counting.lists
        served.answer(["epilog", "--all-nodes"], job, 0)
        assert served.releases.wait_for_queued(10)
        assert counting.lists == lists  # known: released by id
        assert [r.owner for r in client.list()] == ["slurm/job/91"]
        served.answer(["epilog", "--all-nodes"], {**job, "SLURM_JOB_ID": "91"}, 0)
        assert served.releases.wait_for_queued(10)
        assert counting.lists == lists + 1 and client.list() == []  # unknown: listed
    finally:
        served.close()
        inventory.close()


# --- the node Epilog: answered once its node's release is done --------------------------------


def node_epilog(job: int, node: str = NODE) -> dict[str, str]:
    """slurmd's node Epilog environment of job `job` on `node`."""
    return {"SLURM_JOB_ID": str(job), "SLURMD_NODENAME": node, "SLURM_CLUSTER_NAME": "c1"}


def test_a_node_epilog_is_answered_once_its_nodes_release_is_done(client, hooks):
    # Slurm keeps the node COMPLETING until its Epilog returns: the release must be done by
    # then, so that no prolog for the next job on these GPUs finds them held
    reserve(client, 60, NODE, "c1")
    reserve(client, 60, "h100-node-2", "c1")
    answer = hooks.answer(["epilog", "--ignore-errors"], node_epilog(60), 0)
    assert answer.code == 0 and f"job 60 on {NODE}: released" in answer.stderr, answer
    assert [r.node_name for r in client.list()] == ["h100-node-2"]  # at once, and that node's
    answer = hooks.answer(["epilog", "--ignore-errors"], node_epilog(60, "h100-node-2"), 0)
    assert answer.code == 0 and client.list() == []


def test_a_node_epilog_releases_what_this_service_reserved_by_id_and_lists_one_node_else(client):
    counting = CountingLists(client.target)
    env = {"GPUALLOC_ALLOCATOR_ADDR": client.target, "SLURM_CONF": "/nonexistent"}
    with WarmInventory(client.target) as inventory:
        served = cli._Hooks(  # noqa: SLF001
            env, ClientSettings.from_env(env), counting, inventory, [], lambda: "c1", sweeps=False
        )
        try:
            served.details.show = lambda job_id: (  # type: ignore[method-assign]
                f"JobId={job_id}\n   NodeList=h100-node-[1-2]\n"
                f"   Nodes={NODE} CPU_IDs=0 Mem=0 GRES=gpu:h100:1(IDX:4)\n"
                "   Nodes=h100-node-2 CPU_IDs=0 Mem=0 GRES=gpu:h100:1(IDX:4)\n"
            )
            job = {
                "SLURM_JOB_ID": "61",
                "SLURM_JOB_NODELIST": "h100-node-[1-2]",
                "SLURM_CLUSTER_NAME": "c1",
                "SLURM_SCRIPT_CONTEXT": "prolog_slurmctld",
            }
            assert served.answer(["prolog"], job, 0).code == 0
            assert len(client.list()) == 2
            lists = counting.lists
            assert served.answer(["epilog"], node_epilog(61), 0).code == 0
            assert counting.lists == lists  # its own: by id
            assert [r.node_name for r in client.list()] == ["h100-node-2"]
            assert served.answer(["epilog"], node_epilog(61, "h100-node-2"), 0).code == 0
            assert counting.lists == lists and client.list() == []
            reserve(client, 62, NODE, "c1")  # reserved elsewhere (the controller's sync)
            assert served.answer(["epilog"], node_epilog(62), 0).code == 0
            assert counting.lists == lists + 1 and client.list() == []  # listed: one node
            assert counting.nodes == [NODE]
        finally:
            served.close()


class HangingLists(AllocatorClient):
    """A client whose List waits for `go`: a release slower than the Epilog's bound."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.go = threading.Event()

    def list(self, *args, **options):
        self.go.wait(10)
        return super().list(*args, **options)


def test_a_node_epilog_never_fails_not_even_when_its_release_does(client, monkeypatch):
    # Slurm drains a node whose Epilog fails: a release that fails, or outlasts the bound, is
    # said on standard error (slurmd's log), the answer is 0, and the release goes on
    monkeypatch.setattr(cli, "NODE_EPILOG_WAIT_SECONDS", 0.2)
    env = {"GPUALLOC_ALLOCATOR_ADDR": client.target, "SLURM_CONF": "/nonexistent"}
    slow = HangingLists(client.target)
    down_env = {**env, "GPUALLOC_ALLOCATOR_ADDR": "127.0.0.1:9", "GPUALLOC_CLIENT_RETRIES": "1"}
    down = AllocatorClient("127.0.0.1:9", retry=ClientSettings.from_env(down_env).retry)
    with WarmInventory(client.target) as inventory:
        for used, why in ((slow, "still running after 0.2s"), (down, "Unavailable")):
            served = cli._Hooks(  # noqa: SLF001
                env, ClientSettings.from_env(env), used, inventory, [], lambda: "c1",
                sweeps=False,
            )  # fmt: skip
            try:
                reserve(client, 63, NODE, "c1")
                answer = served.answer(["epilog", "--ignore-errors"], node_epilog(63), 0)
                assert answer.code == 0 and f"job 63 on {NODE}: release {why}" in answer.stderr
                if used is slow:
                    slow.go.set()  # the release goes on after the answer
                    assert served.releases.wait_for_queued(10)
                    assert client.list() == []
            finally:
                served.close()
    down.close()


class FailsOnce(AllocatorClient):
    """A client whose first List waits for `go`, then fails (Unavailable); later ones work."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.go = threading.Event()
        self.failures = 1

    def list(self, *args, **options):
        self.go.wait(10)
        if self.failures:
            self.failures -= 1
            raise Unavailable("gpualloc went away")
        return super().list(*args, **options)


def test_a_release_failure_is_told_to_the_epilogs_it_is_for_only(client, monkeypatch):
    # a node Epilog is told its own release's failure: keyed by job id, the failure of an
    # epilog that had stopped waiting (past the bound) was told to the next epilog of a job
    # with that id (Slurm reuses ids when its state is lost), whose release was made
    monkeypatch.setattr(cli, "NODE_EPILOG_WAIT_SECONDS", 0.2)
    env = {"GPUALLOC_ALLOCATOR_ADDR": client.target, "SLURM_CONF": "/nonexistent"}
    failing = FailsOnce(client.target)
    with WarmInventory(client.target) as inventory:
        served = cli._Hooks(  # noqa: SLF001
            env, ClientSettings.from_env(env), failing, inventory, [], lambda: "c1", sweeps=False
        )
        try:
            reserve(client, 64, NODE, "c1")
            first = served.answer(["epilog", "--ignore-errors"], node_epilog(64), 0)
            assert first.code == 0 and "release still running after 0.2s" in first.stderr
            failing.go.set()
            assert served.releases.wait_for_queued(10)  # ... and failed: the lease frees it
            again = served.answer(["epilog", "--ignore-errors"], node_epilog(64), 0)
            assert again.code == 0
            assert again.stderr == f"gpualloc-slurm: job 64 on {NODE}: released\n"
            assert client.list() == []
        finally:
            served.close()
    failing.close()
