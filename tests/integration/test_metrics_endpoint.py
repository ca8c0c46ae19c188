"""`curl 127.0.0.1:<port>/metrics` on a real `gpualloc serve --demo`: the fleet gauges move.

A real process with both services, reservations made over gRPC, the endpoint read over real
HTTP and parsed with prometheus-client's own text parser.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from protos.allocator.v1 import allocator_pb2, allocator_pb2_grpc
from tests.e2e.allocator_harness import pb_claims, wait_serving
from tests.ports import free_port
from tests.unit.deploy.monitoring import TARGET_LABELS, every_expr, grouping_labels, selectors

ROOT = Path(__file__).resolve().parents[2]
OWNER = "team-a/job-1"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def fleet(samples: Samples) -> Samples:
    return {
        key: v
        for key, v in samples.items()
        if key[0].startswith("gpualloc_fleet_")
        and key[0] != "gpualloc_fleet_count_duration_seconds"
    }


class Served:
    def __init__(self, stub: allocator_pb2_grpc.AllocatorStub, metrics_url: str) -> None:
        self.stub = stub
        self.metrics_url = metrics_url

    def scrape(self) -> Samples:
        with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
            text = response.read().decode()
        return {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def scrape_after(self, before: Samples, timeout: float = 30.0) -> Samples:
        """The first scrape whose fleet gauges differ from `before`'s (a recount waits ten times
        the last count's duration: fleet_metrics.py), or the last one after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            samples = self.scrape()
            if fleet(samples) != fleet(before) or time.monotonic() > deadline:
                return samples
            time.sleep(0.05)

    def settled(self) -> Samples:
        """A scrape once the fleet gauges stopped changing (earlier tests' changes counted)."""
        samples = self.scrape()
        for _ in range(20):
            time.sleep(0.2)
            again = self.scrape()
            if fleet(again) == fleet(samples):
                return again
            samples = again
        raise AssertionError("the fleet gauges do not settle")

    def reserve(self, *claim_names: str, owner: str = OWNER) -> allocator_pb2.AllocateResponse:
        response = self.stub.Allocate(
            allocator_pb2.AllocateRequest(
                claims=pb_claims(*claim_names), reserve=True, owner=owner
            ),
            timeout=10,
        )
        assert response.outcome == allocator_pb2.OUTCOME_ALLOCATED, response
        return response


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    port, metrics_port = free_port(), free_port()
    log_path = tmp_path_factory.mktemp("metrics") / "serve.log"
    env = {**os.environ, "GPUALLOC_LOG_FORMAT": "text", "GPUALLOC_REDIS_URL": ""}
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "services.cli",
                "serve",
                "--demo",
                "--listen",
                f"127.0.0.1:{port}",
                "--metrics-listen",
                f"127.0.0.1:{metrics_port}",
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_serving(f"127.0.0.1:{port}")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Served(
                allocator_pb2_grpc.AllocatorStub(channel),
                f"http://127.0.0.1:{metrics_port}/metrics",
            )
    finally:
        process.terminate()
        process.wait(15)
    assert "Prometheus metrics on http://127.0.0.1:" in log_path.read_text()


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels` (0 when none)."""
    wanted = set(labels.items())
    return sum(v for (n, found), v in samples.items() if n == name and wanted <= found)


H100 = {"model": "NVIDIA H100 80GB HBM3"}


def test_the_demo_fleet_is_counted_per_node_pool_and_model(served):
    samples = served.scrape()
    assert value(samples, "gpualloc_fleet_gpus_capacity") == 24
    assert value(samples, "gpualloc_fleet_gpus_capacity", node="h100-node-1", **H100) == 8
    assert value(samples, "gpualloc_fleet_gpus_capacity", pool="a100-node-1") == 4
    states = {
        dict(labels)["state"]
        for (name, labels) in samples
        if name == "gpualloc_fleet_gpus" and dict(labels)["node"] == "l40s-node-1"
    }
    assert "free" in states
    assert value(samples, "gpualloc_inventory_server_nodes") == 4
    assert value(samples, "gpualloc_inventory_connected") == 1


def test_a_reservation_moves_the_reserved_then_the_committed_gauge(served):
    before = served.settled()
    response = served.reserve("one-h100")
    reservation = response.reservations[0]
    reserved = served.scrape_after(before)
    for state, change in (("reserved", 1), ("free", -1), ("committed", 0)):
        moved = value(reserved, "gpualloc_fleet_gpus", state=state, **H100) - value(
            before, "gpualloc_fleet_gpus", state=state, **H100
        )
        assert moved == change, state
    assert value(reserved, "gpualloc_fleet_tenant_gpus", tenant="team-a", state="reserved") == 1
    served.stub.Commit(
        allocator_pb2.CommitRequest(reservation_id=reservation.id, owner=OWNER), timeout=5
    )
    committed = served.scrape_after(reserved)
    assert (
        value(committed, "gpualloc_fleet_gpus", state="committed", **H100)
        == value(before, "gpualloc_fleet_gpus", state="committed", **H100) + 1
    )
    assert value(committed, "gpualloc_fleet_tenant_gpus", tenant="team-a", state="committed") == 1
    served.stub.Release(
        allocator_pb2.ReleaseRequest(reservation_id=reservation.id, owner=OWNER), timeout=5
    )
    released = served.scrape_after(committed)
    assert value(released, "gpualloc_fleet_gpus", state="free", **H100) == value(
        before, "gpualloc_fleet_gpus", state="free", **H100
    )


def test_a_mig_slice_takes_a_partition_and_fragments_its_node(served):
    mig = {"node": "a100-node-1", "profile": "1g.5gb"}
    before = served.settled()
    assert value(before, "gpualloc_fleet_fragmentation", node="a100-node-1") == 0
    response = served.reserve("mig-small-else-medium", owner="team-b/notebook")
    after = served.scrape_after(before)
    assert value(after, "gpualloc_fleet_partitions_free", **mig) == (
        value(before, "gpualloc_fleet_partitions_free", **mig) - 1
    )
    # one of four A100s is partly held: the free capacity outside whole GPUs is its free part
    fragmentation = value(after, "gpualloc_fleet_fragmentation", node="a100-node-1")
    assert 0 < fragmentation < 0.25
    assert value(after, "gpualloc_fleet_gpus", node="a100-node-1", state="free") == 3
    held = value(after, "gpualloc_fleet_tenant_gpus", tenant="team-b")
    assert 0 < held < 1  # a partition is a share of a GPU
    served.stub.Release(
        allocator_pb2.ReleaseRequest(
            reservation_id=response.reservations[0].id, owner="team-b/notebook"
        ),
        timeout=5,
    )


def test_rpc_latency_and_store_latency_are_histograms(served):
    served.stub.Allocate(allocator_pb2.AllocateRequest(claims=pb_claims("one-h100")), timeout=10)
    samples = served.scrape()
    allocate = {"rpc_method": "gpualloc.allocator.v1.Allocator/Allocate"}
    assert value(samples, "gpualloc_rpc_server_duration_seconds_count", **allocate) >= 1
    assert value(
        samples, "gpualloc_rpc_server_duration_seconds_bucket", le="+Inf", **allocate
    ) == value(samples, "gpualloc_rpc_server_duration_seconds_count", **allocate)
    assert value(samples, "gpualloc_store_duration_seconds_count", operation="reserve") >= 1
    assert ("gpualloc_reservation_conflicts_total", frozenset()) in samples  # 0 from the start


def test_promtool_check_metrics_finds_nothing(served):
    """Prometheus' own linter on a real scrape (every histogram sampled): HELP on every
    metric, counters ending in `_total`, base units; and every duration in seconds, with the
    unit suffix (`_seconds`), which promtool does not check by itself."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool missing: apt-get install prometheus (.ci/run installs it)")
    before = served.settled()
    reservation = served.reserve("one-h100", owner="team-d/lint").reservations[0]
    served.scrape_after(before)
    with urllib.request.urlopen(served.metrics_url, timeout=10) as response:
        text = response.read().decode()
    served.stub.Release(
        allocator_pb2.ReleaseRequest(reservation_id=reservation.id, owner="team-d/lint"),
        timeout=5,
    )
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    families = list(text_string_to_metric_families(text))
    durations = [f.name for f in families if "duration" in f.name]
    assert durations and all(name.endswith("_seconds") for name in durations), durations
    assert not [f.name for f in families if "milliseconds" in f.name]
    assert all(f.documentation for f in families), [f.name for f in families if not f.documentation]


def test_every_metric_and_label_the_dashboard_and_alerts_use_is_exported(served):
    # every histogram has samples once a reservation was made; per-tenant series while held
    before = served.settled()
    reservation = served.reserve("one-h100", owner="team-d/x").reservations[0]
    labels: dict[str, set[str]] = {}
    for name, found in served.scrape_after(before):
        labels.setdefault(name, set()).update(label for label, _ in found)
    served.stub.Release(
        allocator_pb2.ReleaseRequest(reservation_id=reservation.id, owner="team-d/x"), timeout=5
    )
    added = TARGET_LABELS | {"le"}  # Prometheus' target labels; the buckets' bound
    for where, expr in every_expr():
        named = selectors(expr)
        assert named, f"{where}: names no gpualloc metric"
        for metric, matched in named:
            assert metric in labels, f"{where}: {metric} is not exported"
            assert matched <= labels[metric] | added, f"{where}: {metric}{{{sorted(matched)}}}"
        known = set().union(*(labels[metric] for metric, _ in named)) | added
        assert grouping_labels(expr) <= known, f"{where}: by/without {grouping_labels(expr)}"


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["services.cli", "serve", "--demo"], id="gpualloc-serve"),
        pytest.param(["services.allocator", "--seed", "examples/cluster"], id="gpualloc-allocator"),
        pytest.param(["services.inventory"], id="gpualloc-inventory"),
    ],
)
@pytest.mark.parametrize("given_by", ["--metrics-listen", "GPUALLOC_METRICS_LISTEN"])
def test_a_busy_metrics_port_stops_the_server_with_one_line(command, given_by):
    """The line names where the busy address came from: the flag (which wins over the
    variable) or the variable."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        env = {**os.environ, "GPUALLOC_LOG_FORMAT": "text", "GPUALLOC_REDIS_URL": ""}
        flags = ["--metrics-listen", address]
        if given_by != "--metrics-listen":
            env[given_by], flags = address, []
        done = subprocess.run(
            [sys.executable, "-m", *command, "--listen", f"127.0.0.1:{free_port()}", *flags],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2, done.stderr
    assert f"cannot listen on {address} ({given_by})" in done.stderr
    assert "Traceback" not in done.stderr


def _serve_demo(env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """`gpualloc serve --demo` as `make run` starts it; (the process, its gRPC address)."""
    address = f"127.0.0.1:{free_port()}"
    inherited = {k: v for k, v in os.environ.items() if k != "GPUALLOC_METRICS_LISTEN"}
    process = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "serve", "--demo", "--listen", address]
        + ["--web-listen", ""],
        cwd=ROOT,
        env={**inherited, "GPUALLOC_LOG_FORMAT": "text", "GPUALLOC_REDIS_URL": "", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return process, address


def _stopped(process: subprocess.Popen[str]) -> str:
    process.terminate()
    output, _ = process.communicate(timeout=30)
    return output


def test_make_run_lets_gpualloc_metrics_listen_move_the_endpoint():
    """`make run` is `gpualloc serve --demo` with no metrics flag, so the variable moves the
    endpoint off the demo's 127.0.0.1:9464 (a second `make run` can have its own)."""
    recipe = ROOT.joinpath("Makefile").read_text().split("\nrun:", 1)[1].split("\n\n", 1)[0]
    assert "gpualloc serve --demo" in recipe and "--metrics-listen" not in recipe
    metrics = f"127.0.0.1:{free_port()}"
    process, address = _serve_demo({"GPUALLOC_METRICS_LISTEN": metrics})
    try:
        wait_serving(address)
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as response:
            assert b"gpualloc_fleet_gpus" in response.read()
    finally:
        output = _stopped(process)
    assert f"Prometheus metrics on http://{metrics}/metrics" in output, output


def test_a_busy_demo_metrics_port_is_a_warning_not_a_failure():
    """A second `make run`: the demo's default port is taken, the server serves without
    metrics and says how to choose another (as for the web view)."""
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            taken.bind(("127.0.0.1", 9464))
            taken.listen()
        except OSError:  # busy already (another server here): the same case
            pass
        process, address = _serve_demo({})
        try:
            wait_serving(address)
        finally:
            output = _stopped(process)
    assert "no metrics endpoint: cannot listen on 127.0.0.1:9464 (the --demo default)" in output
    assert "choose another with --metrics-listen" in output and "Traceback" not in output
