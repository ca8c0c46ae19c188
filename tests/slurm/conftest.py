"""A real Slurm for the bridge: munged, slurmctld and one slurmd from Debian's slurm-wlm.

Everything runs on loopback with free ports in a private directory: the munge key and socket,
slurmctld's state, slurmd's spool, the logs, and character-device stand-ins for the node's
GPUs (`mknod dev/nvidia<N> c 195 <N>`, the NVIDIA major number) that gres.conf's `File=` lines
name. cgroup.conf constrains devices (cgroup v1, as this machine mounts it), so a job can open
exactly the stand-ins of the GPUs Slurm gave it: opening an allowed one fails with ENXIO (no
driver behind it), a denied one with EPERM (the cgroup).

The nodes are `h100-node-1` and `h100-node-2` of the demo inventory (two slurmd on this
machine, sharing the stand-ins); gpualloc is the project's own in-process
server (services.bridges.local_cluster) on a free port; gres.conf is what
`gpualloc-slurm gres-conf --node h100-node-1` writes, and slurm.conf's gpualloc lines, the
cgroup.conf, the compiled hook client linked into the PrologSlurmctld / TaskProlog / node
Epilog slots, its settings file and the portable scripts are the ones in examples/bridges/slurm
(`make peers` builds the client), with only their paths and address replaced.

The binaries are never faked or skipped: if they are missing (or the run is not root: slurmd,
mknod and cgroups need it) the tests FAIL with what to install — .ci/run installs them. Tests
that use the fixture get the `slurm` marker, so `pytest -m "not slurm"` deselects them.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from services.bridges import local_cluster
from services.bridges.slurm import cli
from services.client import AllocatorClient, Reservation
from tests.peers import peer
from tests.ports import free_port
from tests.unit.bridges.support import ROOT, release_everything

SLURM_MISSING = (
    "{name} not found: install Debian's Slurm and MUNGE (apt-get install slurm-wlm munge) — "
    ".ci/run does this"
)
NOT_ROOT = "the real-Slurm tests need root (slurmd, mknod and cgroups); run them as root"
EXAMPLES = ROOT / "examples" / "bridges" / "slurm"
NODE = "h100-node-1"
NODES = (NODE, "h100-node-2")
"""Two slurmd on this machine (Debian's slurmd runs one per `-N` name, on its own port); the
default partition `gpu` is NODE alone, partition `multi` both (for multi-node jobs)."""
GPUS = 8
NVIDIA_MAJOR = 195
START_TIMEOUT_SECONDS = 90.0
"""munged, slurmctld and both slurmd up and the nodes idle: seconds alone, much more on a
loaded 2-core machine running the rest of the suite."""
JOB_TIMEOUT_SECONDS = 120.0
"""A job's steps (its prolog alone starts a Python process) on a loaded 2-core machine: the
first job of a module took over 60 s in a run beside 5 other test suites."""
TEST_TIMEOUT_SECONDS = 300.0
"""Each slurm test's own time (pytest-timeout `func_only`): the module's cluster start and the
session's system install are bounded by their own timeouts instead. Counted against the
suite's 120 s a test, a start under load timed out in the first test's setup, and the module
fixture's cached failure then errored every test of the module (issue 28: 24 errors in
tests/slurm on a loaded machine, each test passing alone)."""
START_ATTEMPTS = 3
"""A daemon that finds its port taken ("Address already in use": free_port's probe and the
daemon's bind race with the suite's other servers) is started again on other ports."""
_SBIN = "/usr/sbin:/usr/bin:/sbin:/bin"
_PROGRAMS = ("munged", "slurmctld", "slurmd", "slurmstepd", "sbatch", "srun", "scontrol", "squeue")
SLOTS = ("prolog-slurmctld", "taskprolog", "epilog", "jobcomp", "epilog-slurmctld")
"""Links to the compiled hook client in <directory>/gpualloc/, named after the hook each stands
for (examples/bridges/slurm/gpualloc-hook/main.go): slurm.conf names the first three
(PrologSlurmctld, TaskProlog, Epilog), the other two are the release's other wirings (the
benchmark's)."""
RELEASE_SLOT = "epilog"
"""The slot of the job's release in examples/bridges/slurm/slurm.conf (the node Epilog)."""
SCRIPTS = (
    "prolog-slurmctld.sh", "taskprolog.sh", "epilog.sh", "jobcomp.sh", "epilog-slurmctld.sh",
)  # fmt: skip
"""examples/bridges/slurm's portable scripts, beside the links (a site without the compiled
client names them in slurm.conf: `portable_wiring` puts them in the links' place)."""
HOOK = "gpualloc-hook.py"
"""Their portable client of `gpualloc-slurm sync --socket`, next to them."""
COMPILED_HOOK = "gpualloc-hook"
"""The compiled client (examples/bridges/slurm/gpualloc-hook/, built by `make peers` into
.peers/bin/), next to them: the links name it, and the scripts use it when it is there."""
HOOK_SETTINGS = "gpualloc-hook.conf"
"""The compiled client's settings (the socket, the command, the allocator), next to it."""
CGROUP_LOCK = Path(tempfile.gettempdir()) / "gpualloc-slurm-cgroups.lock"
"""Held from a Slurm's start to its stop: every Slurm here names its cgroups after the same
nodes (`slurm_h100-node-1`), and a second one starting clears them, killing the first one's
jobs (their slurmstepd gone, Slurm requeues them). So two Slurms on one machine (tests in
parallel, the benchmark beside them) take turns instead."""
LOCK_TIMEOUT_SECONDS = 3600.0
_SLURM_FIXTURES = frozenset({"slurm_cluster", "slurm", "system_install"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _SLURM_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slurm)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_SECONDS, func_only=True))


def _binary(name: str) -> str:
    found = shutil.which(name, path=f"{os.environ.get('PATH', '')}:{_SBIN}")
    if found is None:
        pytest.fail(SLURM_MISSING.format(name=name), pytrace=False)
    return found


class TcpProxy:
    """127.0.0.1:<port> -> gpualloc, so a test can take gpualloc away from Slurm's scripts
    (`down()`: every connection is closed at once, as by a load balancer without backends)
    and give it back (`up()`), while the server and its reservations stay as they were."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._up = threading.Event()
        self._up.set()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._to_close = 0
        self.closed: list[str] = []
        """Each connection the proxy closed as it came (when, why): log_tail shows them."""
        threading.Thread(target=self._accept, name="slurm-test-proxy", daemon=True).start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def down(self) -> None:
        self._up.clear()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def up(self) -> None:
        self._up.set()

    def close_next(self, count: int = 1) -> None:
        """Close the next `count` connections as they come (a backend gone for a moment)."""
        with self._lock:
            self._to_close += count

    def _refuse(self, client: socket.socket, why: str) -> None:
        client.close()
        self.closed.append(f"{time.strftime('%H:%M:%S')} closed a connection: {why}")

    def close(self) -> None:
        self.down()
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._up.is_set():
                self._refuse(client, "down")
                continue
            with self._lock:
                closing, self._to_close = self._to_close > 0, max(self._to_close - 1, 0)
            if closing:
                self._refuse(client, "close_next")
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError as error:
                self._refuse(client, f"upstream {self.upstream}: {error}")
                continue
            server.settimeout(None)  # the timeout was the connect's: an idle stream stays open
            with self._lock:
                self._open.update((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            with self._lock:
                self._open.discard(source)
                self._open.discard(sink)


@dataclass
class SlurmCluster:
    """The running daemons, the gpualloc server they use, and helpers to run jobs."""

    directory: Path
    gpualloc: local_cluster.LocalCluster
    proxy: TcpProxy
    env: dict[str, str]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    epilog_may_fail: bool = False
    """Set by a test that makes a job completion script or EpilogSlurmctld fail (the other
    release wirings); any other failure fails the test. A node Epilog never may."""
    cgroups: int | None = None
    """The CGROUP_LOCK this Slurm holds until `stop()`."""

    def controller_log(self) -> str:
        path = self.directory / "log" / "slurmctld.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def node_log(self, node: str = NODE) -> str:
        path = self.directory / "log" / f"slurmd-{node}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    @property
    def target(self) -> str:
        return self.gpualloc.target

    @property
    def dev(self) -> Path:
        return self.directory / "dev"

    @property
    def out(self) -> Path:
        return self.directory / "out"

    def run(
        self, *argv: str, check: bool = True, timeout: float = JOB_TIMEOUT_SECONDS
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and done.returncode != 0:
            pytest.fail(
                f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}{done.stderr}\n"
                f"{self.log_tail()}",
                pytrace=False,
            )
        return done

    def sbatch(self, *options: str, script: str, user: str = "") -> str:
        """Submit a batch job (as `user`, when given, through runuser); its id."""
        path = self.out / f"job-{time.monotonic_ns()}.sh"
        path.write_text("#!/bin/sh\n" + script)
        path.chmod(0o755)
        run_as = ["runuser", "-u", user, "--"] if user else []
        argv = [*run_as, "sbatch", "--parsable", f"--output={self.out}/%j.out", *options]
        done = self.run(*argv, str(path))
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job -o` as fields (empty once slurmctld forgot the job)."""
        done = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        if done.returncode != 0:
            return {}
        return _fields(done.stdout)

    def job_details(self, job_id: str) -> str:
        return self.run("scontrol", "show", "job", "-d", job_id).stdout

    def wait_for(
        self, job_id: str, states: Sequence[str], timeout: float = JOB_TIMEOUT_SECONDS
    ) -> dict[str, str]:
        """The job's fields once its state is one of `states`."""
        deadline = time.monotonic() + timeout
        seen: dict[str, str] = {}
        while time.monotonic() < deadline:
            seen = self.job(job_id)
            if seen.get("JobState") in states:
                return seen
            time.sleep(0.2)
        pytest.fail(
            f"job {job_id} not {'/'.join(states)} after {timeout:g}s: {seen}\n{self.log_tail()}",
            pytrace=False,
        )

    def wait_for_file(self, path: Path, timeout: float = JOB_TIMEOUT_SECONDS) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists():
                return path.read_text()
            time.sleep(0.1)
        pytest.fail(f"{path} did not appear within {timeout:g}s\n{self.log_tail()}", pytrace=False)

    def node(self, name: str = NODE) -> dict[str, str]:
        return _fields(self.run("scontrol", "show", "node", "-o", name).stdout)

    def reservations(self, owner: str = "") -> list[Reservation]:
        with AllocatorClient(self.target) as client:
            return client.list(owner=owner)

    def wait_until_idle(self, timeout: float = JOB_TIMEOUT_SECONDS) -> None:
        """No job left and the nodes idle (and never drained)."""
        deadline = time.monotonic() + timeout
        states: list[str] = []
        while time.monotonic() < deadline:
            jobs = self.run("squeue", "-h", "-o", "%i").stdout.split()
            states = [self.node(n).get("State", "") for n in NODES]
            if not jobs and states == ["IDLE"] * len(NODES):
                return
            time.sleep(0.2)
        pytest.fail(f"nodes {NODES} are {states}, not IDLE\n{self.log_tail()}", pytrace=False)

    def log_tail(self, lines: int = 30) -> str:
        shown = []
        for name in ("slurmctld.log", *(f"slurmd-{n}.log" for n in NODES), "sync.log"):
            path = self.directory / "log" / name
            text = path.read_text(errors="replace") if path.exists() else "(no log)"
            shown.append(f"--- {name}\n" + "\n".join(text.splitlines()[-lines:]))
        shown.append("--- the proxy to gpualloc\n" + "\n".join(self.proxy.closed[-lines:]))
        return "\n".join(shown)

    @property
    def socket(self) -> Path:
        """Where the scripts' gpualloc-hook.py finds `gpualloc-slurm sync --socket`."""
        return self.directory / "gpualloc" / "hooks.sock"

    @contextlib.contextmanager
    def syncing(self, *options: str, **environ: str) -> Iterator[subprocess.Popen[bytes]]:
        """`gpualloc-slurm sync --socket` running (as the controller's service would: the
        scripts' work then goes through it), with `environ` added (GPUALLOC_SLURM_LEASE=...);
        stopped (SIGTERM) on the way out or by the test. Its log is log/sync.log."""
        argv = [
            str(Path(sys.executable).parent / "gpualloc-slurm"),
            "sync",
            f"--socket={self.socket}",
            *options,
        ]
        env = {**self.env, "GPUALLOC_ALLOCATOR_ADDR": self.proxy.target, **environ}
        with (self.directory / "log" / "sync.log").open("ab") as log:
            process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + START_TIMEOUT_SECONDS
            while not self.socket.exists() and process.poll() is None:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            yield process
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=30)

    @contextlib.contextmanager
    def script(self, name: str, text: str) -> Iterator[None]:
        """One of the gpualloc scripts, or a slot's link to the compiled client, replaced by
        the script `text` (Slurm runs it anew for every job) for the block, then restored."""
        path = self.directory / "gpualloc" / name
        link = os.readlink(path) if path.is_symlink() else None
        before = None if link is not None else path.read_text()
        path.unlink()
        path.write_text(text)
        path.chmod(0o755)
        try:
            yield
        finally:
            path.unlink()
            if link is not None:
                path.symlink_to(link)
            else:
                path.write_text(before or "")
                path.chmod(0o755)

    def script_text(self, name: str) -> str:
        return (self.directory / "gpualloc" / name).read_text()

    @contextlib.contextmanager
    def hook_settings(self, **values: str) -> Iterator[None]:
        """gpualloc-hook.conf with `values` set (the compiled client's settings, which it
        passes to the command it runs when the service does not answer) for the block."""
        path = self.directory / "gpualloc" / HOOK_SETTINGS
        before = path.read_text()
        kept = [line for line in before.splitlines() if line.split("=", 1)[0] not in values]
        path.write_text("\n".join([*kept, *(f"{k}={v}" for k, v in values.items())]) + "\n")
        try:
            yield
        finally:
            path.write_text(before)

    @contextlib.contextmanager
    def portable_wiring(self) -> Iterator[None]:
        """slurm.conf's slots running the portable scripts (prolog-slurmctld.sh, ...) with
        gpualloc-hook.py, as on a site without the compiled client, for the block."""
        with contextlib.ExitStack() as stack:
            for slot in SLOTS:
                stack.enter_context(self.script(slot, self.script_text(f"{slot}.sh")))
            compiled = self.directory / "gpualloc" / COMPILED_HOOK
            compiled.rename(compiled.with_suffix(".away"))
            stack.callback(compiled.with_suffix(".away").rename, compiled)
            yield

    @contextlib.contextmanager
    def served_by(self, port: int, **environ: str) -> Iterator[None]:
        """Another gpualloc (127.0.0.1:`port`, one with an access policy, say) behind the proxy
        for the block, and every gpualloc script exporting `environ` first (the bridge's TLS
        files); on the way out every job is cancelled while that gpualloc still answers their
        epilogs, then the module's gpualloc and scripts are back."""
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in environ.items())
        upstream = self.proxy.upstream
        with contextlib.ExitStack() as stack:
            stack.enter_context(self.hook_settings(**environ))
            for name in SCRIPTS:
                shebang, _, rest = self.script_text(name).partition("\n")
                stack.enter_context(self.script(name, f"{shebang}\n{exports}{rest}"))
            self.proxy.upstream = ("127.0.0.1", port)
            try:
                yield
            finally:
                self.run("scancel", "--full", "--user=root", check=False)
                deadline = time.monotonic() + JOB_TIMEOUT_SECONDS
                while self.run("squeue", "-h", "-o", "%i").stdout.split():
                    if time.monotonic() > deadline:
                        break  # the `slurm` fixture's teardown says what is left
                    time.sleep(0.2)
                self.proxy.upstream = upstream

    def stop(self) -> None:
        self.run("scancel", "--full", "--user=root", check=False)
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        _remove_cgroups()
        if self.cgroups is not None:
            os.close(self.cgroups)  # the next Slurm of this machine may start
            self.cgroups = None


def _take_cgroups(timeout: float = LOCK_TIMEOUT_SECONDS) -> int:
    """CGROUP_LOCK, once no other Slurm of this machine holds it (at most `timeout`)."""
    fd = os.open(CGROUP_LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    deadline = time.monotonic() + timeout
    waited = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                pytest.fail(f"another Slurm held {CGROUP_LOCK} for {timeout:g}s", pytrace=False)
            if not waited:
                print(f"waiting for another Slurm of this machine to stop ({CGROUP_LOCK})")
                waited = True
            time.sleep(0.5)


def _fields(text: str) -> dict[str, str]:
    """`scontrol show … -o`'s one line as {field: value}."""
    return {k: v.strip() for k, v in re.findall(r"(\w+)=(.*?)(?= \w+=|$)", text.strip())}


def _remove_cgroups(timeout: float = 10.0) -> None:
    """slurmd's cgroup v1 directories (`slurm_<node>`), deepest first. A job process that
    outlived its slurmstepd (being killed, say) keeps its cgroup busy: it is killed, and the
    removal retried until `timeout`."""
    deadline = time.monotonic() + timeout
    for top in (t for n in NODES for t in Path("/sys/fs/cgroup").glob(f"*/slurm_{n}")):
        for directory in [*sorted(top.rglob("*"), key=lambda p: len(p.parts), reverse=True), top]:
            while directory.is_dir():
                try:
                    directory.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    _kill_members(directory)
                    time.sleep(0.1)


def _kill_members(cgroup: Path) -> None:
    procs = cgroup / "cgroup.procs"
    for pid in procs.read_text().split() if procs.exists() else ():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def _render(text: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        text = text.replace(old, new)
    return text


def _gpualloc_lines(replacements: dict[str, str]) -> list[str]:
    """examples/bridges/slurm/slurm.conf's settings (not its example NodeName lines)."""
    lines = (EXAMPLES / "slurm.conf").read_text().splitlines()
    settings = [line for line in lines if line and not line.startswith(("#", "NodeName="))]
    return [_render(line, replacements) for line in settings]


def _slurm_conf(
    directory: Path,
    replacements: dict[str, str],
    settings: Callable[[list[str]], list[str]] | None = None,
) -> str:
    ctld_port = free_port()
    gpualloc_lines = _gpualloc_lines(replacements)
    return "\n".join(
        [
            "ClusterName=gpualloc-test",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={directory}/munge/munge.socket",
            "CredType=cred/munge",
            f"StateSaveLocation={directory}/state",
            f"SlurmdSpoolDir={directory}/spool/%n",
            f"SlurmctldPidFile={directory}/slurmctld.pid",
            f"SlurmdPidFile={directory}/slurmd-%n.pid",
            f"SlurmctldLogFile={directory}/log/slurmctld.log",
            f"SlurmdLogFile={directory}/log/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/backfill",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "MpiDefault=none",
            # the node says 16 CPUs whatever this machine has, so jobs run side by side
            "SlurmdParameters=config_overrides",
            *(settings(gpualloc_lines) if settings else gpualloc_lines),
            *(
                f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={free_port()} "
                f"CPUs=16 RealMemory=1000 Gres=gpu:h100:{GPUS} Features=nvlink State=UNKNOWN"
                for n in NODES
            ),
            f"PartitionName=gpu Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
            f"PartitionName=multi Nodes={','.join(NODES)} MaxTime=INFINITE State=UP",
            "",
        ]
    )


def _gres_conf(target: str, dev: Path) -> str:
    text = ""
    for node in NODES:
        out, err = io.StringIO(), io.StringIO()
        environ = {"GPUALLOC_ALLOCATOR_ADDR": target}
        code = cli.main(["gres-conf", "--node", node], environ, out, err)
        assert code == 0, err.getvalue()
        text += out.getvalue()
    return text.replace("File=/dev/nvidia", f"File={dev}/nvidia")


def _start(cluster: SlurmCluster, argv: Sequence[str], name: str) -> None:
    with (cluster.directory / "log" / f"{name}.out").open("ab") as log:
        process = subprocess.Popen(
            list(argv),
            env=cluster.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    cluster.processes.append(process)


def _wait_for_idle_node(cluster: SlurmCluster) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        for process in cluster.processes:
            if process.poll() is not None:
                cluster.stop()  # the daemons that did start
                pytest.fail(
                    f"{process.args!r} exited {process.returncode} at start\n{cluster.log_tail()}",
                    pytrace=False,
                )
        done = cluster.run("sinfo", "-h", "-N", "-p", "multi", "-o", "%T", check=False)
        if done.returncode == 0 and done.stdout.split() == ["idle"] * len(NODES):
            return
        time.sleep(0.2)
    cluster.stop()
    pytest.fail(f"slurmd did not come up idle\n{cluster.log_tail()}", pytrace=False)


def start_slurm(
    directory: Path,
    gpualloc: local_cluster.LocalCluster,
    proxy: TcpProxy,
    settings: Callable[[list[str]], list[str]] | None = None,
) -> SlurmCluster:
    """`settings`: what to make of examples/bridges/slurm/slurm.conf's lines (paths replaced),
    for the benchmark (loadtest/bench_slurm.py: plain Slurm, other scheduler settings)."""
    if os.geteuid() != 0:
        pytest.fail(NOT_ROOT, pytrace=False)
    programs = {name: _binary(name) for name in _PROGRAMS}
    for sub in ("munge", "state", "log", "dev", "out", "gpualloc", *(f"spool/{n}" for n in NODES)):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)
    (directory / "out").chmod(0o777)
    for index in range(GPUS):
        os.mknod(
            directory / "dev" / f"nvidia{index}", 0o666 | 0o020000, os.makedev(NVIDIA_MAJOR, index)
        )
    key = directory / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    (directory / "munge").chmod(0o755)  # the socket is for every job user; munged checks it

    conf = directory / "slurm.conf"
    bin_dir = Path(sys.executable).parent
    replacements = {
        "/etc/slurm/gpualloc/": f"{directory}/gpualloc/",
        "/opt/gpualloc/bin/": f"{bin_dir}/",
        "gpualloc.example.com:50051": proxy.target,
        "/etc/slurm/slurm.conf": str(conf),
        "/run/gpualloc-slurm.sock": str(directory / "gpualloc" / "hooks.sock"),
    }
    for script in (*SCRIPTS, HOOK, HOOK_SETTINGS):
        path = directory / "gpualloc" / script
        path.write_text(_render((EXAMPLES / script).read_text(), replacements))
        path.chmod(0o644 if script == HOOK_SETTINGS else 0o755)
    shutil.copy(peer(COMPILED_HOOK), directory / "gpualloc" / COMPILED_HOOK)
    (directory / "gpualloc" / COMPILED_HOOK).chmod(0o755)
    for slot in SLOTS:
        (directory / "gpualloc" / slot).symlink_to(COMPILED_HOOK)
    (directory / "cgroup.conf").write_text((EXAMPLES / "cgroup.conf").read_text())
    (directory / "gres.conf").write_text(_gres_conf(gpualloc.target, directory / "dev"))

    env = {"PATH": f"{bin_dir}:{_SBIN}", "SLURM_CONF": str(conf), "HOME": str(directory)}
    for attempt in range(1, START_ATTEMPTS + 1):
        conf.write_text(_slurm_conf(directory, replacements, settings))  # new ports each attempt
        cluster = SlurmCluster(directory, gpualloc, proxy, env, cgroups=_take_cgroups())
        try:
            _start_daemons(cluster, programs, key, conf)
            return cluster
        except pytest.fail.Exception:
            if attempt == START_ATTEMPTS or not _port_was_taken(directory):
                raise
            for log in (directory / "log").iterdir():  # the next attempt's logs only
                log.unlink()
    raise AssertionError("unreachable")


def _start_daemons(cluster: SlurmCluster, programs: dict[str, str], key: Path, conf: Path) -> None:
    """munged, slurmctld and both slurmd, until the nodes are idle; on failure (pytest.fail)
    the daemons that did start are stopped."""
    munge = cluster.directory / "munge"
    (munge / "munge.socket").unlink(missing_ok=True)
    _start(
        cluster,
        [
            programs["munged"], "--foreground", "--force",
            f"--socket={munge}/munge.socket", f"--key-file={key}",
            f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log",
            f"--seed-file={munge}/munged.seed",
        ],
        "munged",
    )  # fmt: skip
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while not (munge / "munge.socket").exists():
        if time.monotonic() > deadline or cluster.processes[0].poll() is not None:
            cluster.stop()
            log = munge / "munged.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
            pytest.fail(f"munged did not open its socket\n{tail}", pytrace=False)
        time.sleep(0.05)
    _remove_cgroups()  # left by a killed run
    _start(cluster, [programs["slurmctld"], "-D", "-i", "-f", str(conf)], "slurmctld")
    for node in NODES:
        _start(cluster, [programs["slurmd"], "-D", "-N", node, "-f", str(conf)], f"slurmd-{node}")
    _wait_for_idle_node(cluster)


def _port_was_taken(directory: Path) -> bool:
    logs = (directory / "log").glob("*")
    return any("Address already in use" in p.read_text(errors="replace") for p in logs)


@contextlib.contextmanager
def _shared_directory(prefix: str) -> Iterator[Path]:
    """A fresh directory every job user can enter (pytest's own temporary directories are
    root's alone, so a job user could reach neither the munge socket nor an install there)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def system_install() -> Iterator[Path]:
    """gpualloc installed as docs/bridges.md's setup says (a wheel into a venv of the system's
    python3, root-owned, world-readable): the directory that stands for /opt/gpualloc."""
    with _shared_directory("gpualloc-install-") as top:
        yield _install(top)


def _install(top: Path) -> Path:
    opt = top / "opt-gpualloc"
    python3 = shutil.which("python3", path=_SBIN)  # the system's, as `sudo python3` finds it
    if python3 is None:
        pytest.fail("python3 not found in /usr/bin (Debian's python3-venv)", pytrace=False)
    steps = [
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "-w",
            str(top / "dist"),
            ".",
        ],
        [python3, "-m", "venv", str(opt)],
    ]
    for argv in steps:
        subprocess.run(argv, cwd=ROOT, check=True, capture_output=True, timeout=300)
    (wheel,) = (top / "dist").glob("gpualloc-*.whl")
    subprocess.run(
        [str(opt / "bin" / "pip"), "install", "--quiet", str(wheel)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    subprocess.run(["chmod", "-R", "a+rX", str(opt)], check=True)
    return opt


@contextlib.contextmanager
def slurm_of(gpualloc: local_cluster.LocalCluster) -> Iterator[SlurmCluster]:
    """A real Slurm whose bridge talks to `gpualloc` (through a TcpProxy: `served_by` puts
    another gpualloc behind it), stopped on the way out."""
    with _shared_directory("gpualloc-slurm-") as directory:
        proxy = TcpProxy(("127.0.0.1", gpualloc.port))
        cluster = start_slurm(directory, gpualloc, proxy)
        try:
            yield cluster
        finally:
            cluster.stop()
            proxy.close()


@pytest.fixture(scope="module")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """The real Slurm of a test module, with its own gpualloc."""
    with local_cluster.start() as gpualloc, slurm_of(gpualloc) as cluster:
        yield cluster


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The module's Slurm, idle, and gpualloc without reservations, before and after the test."""
    slurm_cluster.proxy.up()
    slurm_cluster.wait_until_idle()
    release_everything(slurm_cluster.target)
    slurm_cluster.epilog_may_fail = False
    start = len(slurm_cluster.controller_log())
    node_starts = {n: len(slurm_cluster.node_log(n)) for n in NODES}
    yield slurm_cluster
    slurm_cluster.proxy.up()
    slurm_cluster.run("scancel", "--full", "--user=root", check=False)
    slurm_cluster.wait_until_idle()
    release_everything(slurm_cluster.target)
    failed = [
        line
        for line in slurm_cluster.controller_log()[start:].splitlines()
        if "EpilogSlurmctld exit status" in line or "jobcomp/script: script" in line
    ]
    if failed and not slurm_cluster.epilog_may_fail:
        pytest.fail("the job's release failed:\n" + "\n".join(failed), pytrace=False)
    # a node Epilog never fails, whatever gpualloc does: Slurm would drain the node
    node_failed = [
        line
        for n, at in node_starts.items()
        for line in slurm_cluster.node_log(n)[at:].splitlines()
        if "epilog failed" in line
    ]
    if node_failed:
        pytest.fail("a node Epilog failed:\n" + "\n".join(node_failed), pytrace=False)
