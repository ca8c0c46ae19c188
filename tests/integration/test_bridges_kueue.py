"""The Kueue admission controller over the in-memory KueueApi, with a real gpualloc behind it.

Kueue's manifests are the ones of its documentation (tests/data/kueue) and the bridge's
examples (examples/bridges/kueue); Kueue's own part (quota, admission, eviction) is played by
KueueStandIn as Kueue's admission-check documentation describes it.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator

import pytest

from services.bridges import local_cluster
from services.bridges.kueue import cli as kueue_cli
from services.bridges.kueue.controller import AdmissionController, Decision, TenantMode
from services.bridges.kueue.memory_api import KueueStandIn, MemoryKueueApi, workload_for_job
from services.bridges.kueue.objects import AdmissionCheck, CheckState, Workload
from services.bridges.placing import Placer
from services.client import AllocatorClient, InventoryClient, ReservationState, claim_from_spec
from services.common.errors import InvalidArgument
from tests.unit.bridges.support import DATA, ROOT, documents, release_everything

EXAMPLES = ROOT / "examples" / "bridges" / "kueue"
OUR_CHECK = ROOT / "deploy" / "k8s" / "kueue" / "admission-check.yaml"


@pytest.fixture(scope="module")
def cluster() -> Iterator[local_cluster.LocalCluster]:
    with local_cluster.start() as started:
        yield started


class Setup:
    def __init__(self, target: str) -> None:
        self.client = AllocatorClient(target, owner="test")
        self.inventory = InventoryClient(target)
        self.api = MemoryKueueApi()
        self.kueue = KueueStandIn(self.api)
        self.controller = AdmissionController(
            self.api, Placer(self.client, self.inventory), lease_ttl_seconds=30
        )
        for path in (OUR_CHECK, EXAMPLES / "cluster-queue.yml"):
            for document in documents(path):
                self.api.apply(document)

    def submit(self, path, namespace: str | None = None) -> str:
        """The Workload of the file's Job (its ResourceClaimTemplates applied too)."""
        name = ""
        for document in documents(path):
            if document["kind"] == "Job":
                if namespace:
                    document["metadata"]["namespace"] = namespace
                    document["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "gpu-queue"
                name = self.api.apply(workload_for_job(document))["metadata"]["name"]
            else:
                self.api.apply(document)
        return name

    def workload(self, name: str, namespace: str = "team-a") -> Workload:
        return Workload.from_dict(self.api.get("Workload", namespace, name))

    def cycle(self, times: int = 3) -> None:
        """Kueue, then the controller, `times` over (each pass is idempotent)."""
        for _ in range(times):
            self.kueue.step()
            self.controller.reconcile_all()

    def held(self, name: str, namespace: str = "team-a"):
        return self.client.list(owner=f"kueue/{namespace}/{name}")

    def close(self) -> None:
        self.client.close()
        self.inventory.close()


@pytest.fixture
def setup(cluster) -> Iterator[Setup]:
    made = Setup(cluster.target)
    yield made
    made.close()
    release_everything(cluster.target)


def test_our_admission_check_is_marked_active(setup):
    setup.controller.reconcile_all()
    (check,) = [AdmissionCheck.from_dict(d) for d in setup.api.list_admission_checks()]
    assert check.controller_name == "gpualloc.io/admission" and check.active


def test_nvlink_job_is_admitted_on_the_node_that_holds_its_gpus(setup):
    name = setup.submit(EXAMPLES / "h100-nvlink-job.yml")
    setup.kueue.step()
    setup.controller.reconcile_all()
    check = setup.workload(name).check("gpualloc")
    assert check is not None and check.state is CheckState.READY
    (update,) = check.pod_set_updates
    node = update.node_selector["kubernetes.io/hostname"]
    assert update.name == "main" and node.startswith("h100-node")
    (held,) = setup.held(name)
    assert held.node_name == node and held.state is ReservationState.RESERVED
    assert len(held.devices) == 4 and held.idempotency_key.startswith("kueue-")
    setup.cycle()  # Kueue admits (all checks Ready); the controller commits
    assert setup.workload(name).admitted
    assert [r.state for r in setup.held(name)] == [ReservationState.COMMITTED]


def test_mig_pods_and_dra_template_share_the_a100_node(setup):
    mig = setup.submit(EXAMPLES / "mig-inference-job.yml")
    dra = setup.submit(EXAMPLES / "dra-template-job.yml")
    setup.cycle()
    (mig_held,) = setup.held(mig)
    (dra_held,) = setup.held(dra)
    assert mig_held.node_name == dra_held.node_name == "a100-node-1"
    assert len(mig_held.devices) == 3 and all("-mig-1g10gb-" in d.device for d in mig_held.devices)
    assert setup.workload(mig).admitted and setup.workload(dra).admitted


def test_documented_gpu_job_three_pods_one_gpu_each(setup):
    name = setup.submit(DATA / "kueue" / "sample-job.yaml", namespace="team-a")
    setup.cycle()
    (held,) = setup.held(name)
    assert len(held.devices) == 3 and setup.workload(name).admitted


def test_too_big_is_rejected_and_deactivated(setup):
    name = setup.submit(EXAMPLES / "too-big-job.yml")
    setup.cycle()
    workload = setup.workload(name)
    check = workload.check("gpualloc")
    assert check is not None and check.state is CheckState.REJECTED
    assert "can never fit on one node" in check.message
    assert not workload.active and setup.held(name) == []


def test_busy_cluster_means_retry_with_the_holders_named(setup):
    slurm = claim_from_spec("8 x h100", name="slurm-job-7", namespace="slurm")
    for _ in range(2):  # Slurm holds both H100 nodes
        setup.client.allocate([slurm], reserve=True, owner="slurm/job/7", idempotency_key=f"s{_}")
    name = setup.submit(EXAMPLES / "h100-nvlink-job.yml")
    setup.kueue.step()
    setup.controller.reconcile_all()
    check = setup.workload(name).check("gpualloc")
    assert check is not None and check.state is CheckState.RETRY
    assert "held: slurm/job/7 holds" in check.message
    setup.kueue.step(reserve=False)  # Kueue releases the quota and resets the check
    workload = setup.workload(name)
    assert not workload.quota_reserved
    assert workload.check("gpualloc").state is CheckState.PENDING
    release_everything(setup.client.target)  # Slurm's jobs end
    setup.cycle()
    assert setup.workload(name).admitted and len(setup.held(name)) == 1


@pytest.mark.parametrize(
    "end",
    [
        pytest.param(lambda s, n: s.kueue.finish("team-a", n), id="finished"),
        pytest.param(lambda s, n: s.kueue.evict("team-a", n), id="evicted"),
        pytest.param(lambda s, n: s.api.delete("Workload", "team-a", n), id="deleted"),
    ],
)
def test_devices_come_back_when_the_workload_ends(setup, end):
    name = setup.submit(EXAMPLES / "mig-inference-job.yml")
    setup.cycle()
    assert setup.held(name)
    end(setup, name)
    setup.controller.reconcile_all()
    assert setup.held(name) == []


def test_lost_lease_before_admission_goes_back_to_retry(setup):
    name = setup.submit(EXAMPLES / "mig-inference-job.yml")
    setup.kueue.step()
    setup.controller.reconcile_all()
    (held,) = setup.held(name)
    setup.client.release(held, owner=held.owner)  # e.g. it expired
    setup.controller.reconcile_all()
    check = setup.workload(name).check("gpualloc")
    assert check is not None and check.state is CheckState.RETRY
    assert "reservation was lost" in check.message


def test_checks_of_other_controllers_are_left_alone(setup):
    for document in documents(DATA / "kueue" / "provisioning-setup.yaml"):
        setup.api.apply(document)
    (job,) = documents(DATA / "kueue" / "sample-job.yaml")
    name = setup.api.apply(workload_for_job(job))["metadata"]["name"]
    setup.cycle()
    workload = setup.workload(name, "default")
    assert workload.check("sample-prov").state is CheckState.PENDING
    assert setup.api.state_writes == 0 and setup.held(name, "default") == []


def test_run_loop_reacts_to_changes(setup):
    import threading

    stop = threading.Event()
    thread = threading.Thread(target=setup.controller.run, args=(stop, 0.05))
    thread.start()
    try:
        name = setup.submit(EXAMPLES / "mig-inference-job.yml")
        setup.kueue.reserve_quota("team-a", name)
        assert setup.api.wait_for_change(5)
        for _ in range(100):
            check = setup.workload(name).check("gpualloc")
            if check is not None and check.state is CheckState.READY:
                break
            setup.api.wait_for_change(0.05)
        assert check is not None and check.state is CheckState.READY
    finally:
        stop.set()
        thread.join()


def test_command_runs_one_pass_over_any_kueue_api(setup, cluster):
    name = setup.submit(EXAMPLES / "too-big-job.yml")
    setup.kueue.step()
    out = io.StringIO()
    environ = {"GPUALLOC_ALLOCATOR_ADDR": cluster.target}
    assert kueue_cli.run(setup.api, environ, once=True, out=out) == 0
    assert f"team-a/{name}\trejected\tRejected" in out.getvalue()


def test_command_without_the_kubernetes_client_says_what_to_install(capsys, monkeypatch):
    # make does install the client (the `kube` extra); a None entry in sys.modules is how
    # Python spells "this package is not installed" to the import system.
    monkeypatch.setitem(sys.modules, "kubernetes", None)
    assert kueue_cli.main(["--once"], {}) == 3
    assert "pip install kubernetes" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        pytest.param([], {}, TenantMode.BINDING, id="binding-by-default"),
        pytest.param([], {"GPUALLOC_KUEUE_TENANTS": "cluster-queue"}, TenantMode.CLUSTER_QUEUE,
                     id="cluster-queue-by-the-variable"),
        pytest.param(["--tenants", "binding"], {"GPUALLOC_KUEUE_TENANTS": "cluster-queue"},
                     TenantMode.BINDING, id="the-flag-overrides-the-variable"),
        pytest.param([], {"GPUALLOC_KUEUE_TENANTS": "per-queue"}, None, id="an-unknown-mode"),
    ],
)  # fmt: skip
def test_which_tenant_a_workload_is_charged_to_is_a_setting(
    cluster, monkeypatch, argv, environ, expected
):
    made: list[TenantMode] = []

    class Recording(AdmissionController):
        def reconcile_all(self) -> list[Decision]:
            made.append(self.tenants)
            return []

    monkeypatch.setattr(kueue_cli, "AdmissionController", Recording)
    tenants = kueue_cli.build_parser().parse_args(["--once", *argv]).tenants
    environ = {"GPUALLOC_ALLOCATOR_ADDR": cluster.target, **environ}
    if expected is None:
        with pytest.raises(InvalidArgument, match="GPUALLOC_KUEUE_TENANTS"):
            kueue_cli.run(MemoryKueueApi(), environ, once=True, tenants=tenants)
        return
    assert kueue_cli.run(MemoryKueueApi(), environ, once=True, tenants=tenants) == 0
    assert made == [expected]


def test_a_pass_places_its_pending_workloads_in_one_batch(setup, monkeypatch):
    """Three Workloads pending at once: one AllocateBatch carries every pod set, in the order
    the Workloads are listed, and each Workload is decided from its own items (all Ready)."""
    names = [
        setup.submit(EXAMPLES / "h100-nvlink-job.yml"),
        setup.submit(EXAMPLES / "mig-inference-job.yml"),
        setup.submit(EXAMPLES / "dra-template-job.yml"),
    ]
    batches: list[list[str]] = []
    unary: list[str] = []
    many, one = setup.client.allocate_many, setup.client.allocate

    def allocate_many(items):
        batches.append([item.owner for item in items])
        return many(items)

    def allocate(*args, **kwargs):
        unary.append(kwargs.get("owner", ""))
        return one(*args, **kwargs)

    monkeypatch.setattr(setup.client, "allocate_many", allocate_many)
    monkeypatch.setattr(setup.client, "allocate", allocate)
    setup.kueue.step()
    setup.controller.reconcile_all()
    listed = [w["metadata"]["name"] for w in setup.api.list_workloads()]
    assert sorted(listed) == sorted(names)
    assert batches == [[f"kueue/team-a/{name}" for name in listed]]
    assert unary == []
    for name in names:
        check = setup.workload(name).check("gpualloc")
        assert check is not None and check.state is CheckState.READY
        assert len(setup.held(name)) == 1
