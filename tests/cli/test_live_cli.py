"""`gpualloc get|describe|allocate|explain|capacity|commit|renew|release|config|completion`, run
as console scripts against a real `gpualloc serve --demo` (tests/integration/test_serve.py's
fixture, on a free port), with HOME pointed at a scratch folder so no user config leaks in.

The cases of one module share the server, so each one that reserves releases what it took.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.integration.test_serve import served  # noqa: F401 - the running server fixture

ROOT = Path(__file__).resolve().parents[2]
GPUALLOC = str(Path(sys.executable).parent / "gpualloc")
ONE_H100 = "examples/claims/one-h100.yaml"
MIG = "examples/claims/mig-small-else-medium.yaml"
SIXTEEN = "examples/claims/sixteen-h100-one-node.yaml"


@pytest.fixture(scope="module")
def address(served) -> str:  # noqa: F811
    process, _ = served
    args = list(process.args)
    return str(args[args.index("--listen") + 1])


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path


def gpualloc(
    *args: str, home: Path, env: dict[str, str] | None = None, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith("GPUALLOC_")}
    done = subprocess.run(
        [GPUALLOC, *args],
        cwd=ROOT,
        env={**keep, "HOME": str(home), "XDG_CONFIG_HOME": "", **(env or {})},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


@dataclass(frozen=True)
class Query:
    args: tuple[str, ...]
    code: int = 0
    stdout: tuple[str, ...] = ()  # each must be in stdout
    absent: tuple[str, ...] = ()  # none may be in stdout
    stderr: str = ""
    lines: int | None = None  # stdout lines, when it matters
    env: dict[str, str] = field(default_factory=dict)


QUERIES = {
    "get-nodes-table": Query(
        ("get", "nodes"),
        stdout=("NAME", "TAINTED", "MIG-FREE", "a100-node-1", "h100-node-1", "h100-node-2"),
        lines=5,
    ),
    "get-nodes-by-zone-label": Query(
        ("get", "nodes", "-l", "topology.kubernetes.io/zone=zone-a"),
        stdout=("h100-node-1", "h100-node-2"),
        absent=("a100-node-1", "l40s-node-1"),
    ),
    "get-nodes-set-selector": Query(
        ("get", "no", "-l", "gpualloc.dev/rack in (rack-b1, rack-b2),!missing", "-o", "name"),
        stdout=("node/a100-node-1\nnode/l40s-node-1\n",),
        lines=2,
    ),
    "get-nodes-wide": Query(
        ("get", "nodes", "-o", "wide"),
        stdout=("TAINTED", "DEVICES", "BLOCKED", "RESERVATIONS"),
        absent=("LABELS",),
    ),
    "get-nodes-show-labels": Query(
        ("get", "nodes", "l40s-node-1", "--show-labels"),
        stdout=("LABELS", "topology.kubernetes.io/zone=zone-b"),
    ),
    "get-one-node-by-name": Query(("get", "node", "l40s-node-1"), lines=2),
    "get-unknown-node-is-not-found": Query(
        ("get", "nodes", "l40s-node-9"), 4, stderr='NotFound: node "l40s-node-9" not found'
    ),
    "get-devices-of-a-node": Query(
        ("get", "devices", "--node", "l40s-node-1"), stdout=("NVIDIA L40S", "46068Mi"), lines=5
    ),
    "get-devices-by-state": Query(
        ("get", "dev", "--state", "free", "--node", "h100-node-2", "-o", "name"),
        stdout=("device/h100-node-2/gpu-0\n",),
        lines=8,
    ),
    "get-unknown-resource": Query(("get", "pods"), 2, stderr="invalid choice: 'pods'"),
    "get-bad-selector": Query(("get", "nodes", "-l", "zone in ("), 2, stderr="--selector"),
    "describe-node-with-topology": Query(
        ("describe", "node", "h100-node-1"),
        stdout=("Name:          h100-node-1", "PCIE-ROOT", "NVLink", "NV18", "Holders:"),
    ),
    "describe-mig-node-draws-the-layout": Query(
        ("describe", "node", "a100-node-1"),
        stdout=("MIG layout:", "gpu-0-mig-1g5gb-19-0", "1g.5gb", "Counters:"),
    ),
    "describe-unknown-node-suggests": Query(
        ("describe", "node", "h100-nod-1"), 4, stderr="did you mean h100-node-1?"
    ),
    "describe-unknown-reservation": Query(
        ("describe", "reservation", "res-00000000"), 4, stderr="NotFound"
    ),
    "explain-sixteen-h100": Query(
        ("explain", "-f", SIXTEEN), 3, stdout=("outcome: Unsatisfiable", "8 of 16 devices")
    ),
    "explain-one-h100-json": Query(
        ("explain", "-f", ONE_H100, "-o", "json"), stdout=('"outcome": "Allocated"',)
    ),
    "allocate-without-reserving": Query(
        ("allocate", "-f", ONE_H100), stdout=("ALLOCATED on node h100-node-", "default/one-h100")
    ),
    "capacity-of-one-h100": Query(
        ("capacity", "-f", ONE_H100), stdout=("16 more copies fit", "NVIDIA H100 80GB HBM3")
    ),
    "allocate-lease-needs-reserve": Query(
        ("allocate", "-f", ONE_H100, "--lease", "2m"), 2, stderr="--lease: needs --reserve"
    ),
    "allocate-bad-lease": Query(
        ("allocate", "-f", ONE_H100, "--reserve", "--lease", "soon"), 2, stderr="duration"
    ),
    "allocate-files-without-claims": Query(
        ("allocate", "-f", "examples/cluster"), 2, stderr="no ResourceClaim"
    ),
    "allocate-missing-file": Query(
        ("allocate", "-f", "no-such.yaml"), 2, stderr="no-such.yaml: no such file"
    ),
    "commit-unknown-reservation": Query(("commit", "res-00000000"), 4, stderr="NotFound"),
    "release-unknown-ignored": Query(
        ("release", "res-00000000", "--ignore-not-found"), stdout=("not found (ignored)",)
    ),
    "token-without-tls": Query(
        ("get", "nodes", "--token-file", "x"), 2, stderr="sent over TLS only"
    ),
}


@pytest.mark.parametrize("case", [pytest.param(q, id=n) for n, q in QUERIES.items()])
def test_query(case: Query, address: str, home: Path) -> None:
    done = gpualloc(*case.args, "-s", address, home=home, env=case.env)
    assert done.returncode == case.code, done.stderr
    for text in case.stdout:
        assert text in done.stdout
    for text in case.absent:
        assert text not in done.stdout
    assert case.stderr in done.stderr
    if case.lines is not None:
        assert len(done.stdout.splitlines()) == case.lines, done.stdout


@dataclass(frozen=True)
class Convention:
    """One of kubectl's conventions (issue 28): `{server}` in args is the demo server's
    address; `config` the context file's text (GPUALLOC_CONFIG), when the case needs one."""

    args: tuple[str, ...]
    code: int = 0
    stdout: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    stderr: str = ""
    lines: int | None = None  # stdout lines
    config: str = ""


TWO_CONTEXTS = (
    "current-context: demo\ncontexts:\n- name: demo\n  context: {{server: '{server}'}}\n"
    "- name: other\n  context: {{server: '127.0.0.1:1'}}\n"
)
CONVENTIONS = {
    "server-flag-before-the-verb": Convention(
        ("-s", "{server}", "get", "nodes", "-o", "name"), stdout=("node/h100-node-1",), lines=4
    ),
    "server-flag-with-equals-before-the-verb": Convention(
        ("--server={server}", "get", "no", "l40s-node-1", "-o", "name"), lines=1
    ),
    "context-flag-before-the-verb": Convention(
        ("--context", "other", "get", "nodes"), 1, stderr="127.0.0.1:1", config=TWO_CONTEXTS
    ),
    "verb-typo-suggests-the-verb": Convention(
        ("gett", "nodes"), 2, stderr="invalid choice: 'gett' (did you mean get?)"
    ),
    "resource-typo-suggests-the-resource": Convention(
        ("get", "nodez", "-s", "{server}"), 2, stderr="(did you mean node"
    ),
    "output-typo-suggests-the-format": Convention(
        ("get", "nodes", "-o", "yml"), 2, stderr="(did you mean yaml?)"
    ),
    "usage-error-names-the-help": Convention(
        ("describe",), 2, stderr="gpualloc describe: invalid: the following arguments"
    ),
    "malformed-context-file-in-one-line": Convention(
        ("get", "nodes"), 2, stderr="not YAML: line 2, column 1: expected", config="kind: [\n"
    ),
    "allocate-o-name-names-the-node": Convention(
        ("allocate", "-f", ONE_H100, "-o", "name", "-s", "{server}"),
        stdout=("node/h100-node-",),
        lines=1,
    ),
    "allocate-o-name-of-what-does-not-fit": Convention(
        ("allocate", "-f", SIXTEEN, "-o", "name", "-s", "{server}"), 3, stderr="8 of 16", lines=0
    ),
    "release-f-of-something-else-is-refused": Convention(
        ("release", "-f", ONE_H100, "-s", "{server}"), 2, stderr="expected Reservation or Placement"
    ),
    "release-needs-ids-or-f": Convention(("release", "-s", "{server}"), 2, stderr="-f FILE"),
    "get-contexts-leaves-current-empty": Convention(
        ("config", "get-contexts"),
        stdout=("CURRENT   NAME", "*         demo", "\n          other"),
        absent=("<none>",),
        config=TWO_CONTEXTS,
    ),
}


@pytest.mark.parametrize("case", [pytest.param(c, id=n) for n, c in CONVENTIONS.items()])
def test_kubectl_conventions(case: Convention, address: str, home: Path) -> None:
    """Global flags before the verb, one-line usage errors with a did-you-mean, one-line config
    errors, `allocate -o name`, get-contexts' CURRENT column (docs/cli.md)."""
    env = {}
    if case.config:
        (home / "config.yaml").write_text(case.config.format(server=address))
        env["GPUALLOC_CONFIG"] = str(home / "config.yaml")
    done = gpualloc(*(a.format(server=address) for a in case.args), home=home, env=env)
    assert done.returncode == case.code, done.stderr
    for text in case.stdout:
        assert text in done.stdout, done.stdout
    for text in case.absent:
        assert text not in done.stdout, done.stdout
    assert case.stderr in done.stderr
    if case.code:
        assert len(done.stderr.splitlines()) == 1 or case.code == 3, done.stderr
    if case.lines is not None:
        assert len(done.stdout.splitlines()) == case.lines, done.stdout


def test_server_that_is_not_there(home: Path) -> None:
    done = gpualloc("get", "nodes", "-s", "127.0.0.1:1", home=home)
    assert done.returncode == 1
    assert "gpualloc get: cannot reach gpualloc at 127.0.0.1:1" in done.stderr


def test_a_reservation_from_allocate_to_release(address: str, home: Path) -> None:
    """allocate --reserve --lease 2m, then every view shows the holder with its lease expiry,
    then renew, commit and release move it through its states."""
    as_owner = ("-s", address, "--as", "team-a/alice")
    done = gpualloc("allocate", "-f", ONE_H100, "--reserve", "--lease", "2m", *as_owner, home=home)
    assert done.returncode == 0, done.stderr
    match = re.search(
        r"reservation/(\S+) reserved for team-a/alice until \S+ \(in 1m(\d+)s\)", done.stdout
    )
    assert match, done.stdout
    reservation = match[1]
    try:
        listed = gpualloc(
            "get", "reservations", "--owner", "team-a/alice", "-s", address, home=home
        )
        row = next(line for line in listed.stdout.splitlines() if reservation in line)
        assert re.search(r"team-a/alice\s+h100-node-\d\s+Reserved\s+gpu-\d\s+in 1m\d+s", row), row
        node = row.split()[2]
        described = gpualloc("describe", "node", node, "-s", address, home=home).stdout
        assert re.search(rf"reserved\s+team-a/alice \({reservation}, in 1m\d+s\)", described)
        devices = gpualloc("get", "devices", "--node", node, "--state", "reserved", "-o", "json",
                           "-s", address, home=home)  # fmt: skip
        (item,) = json.loads(devices.stdout)["items"]
        assert (item["reservation"], item["owner"], item["state"]) == (
            reservation, "team-a/alice", "reserved"
        )  # fmt: skip
        renewed = gpualloc("renew", reservation, "--lease", "10m", *as_owner, home=home)
        assert re.search(r"renewed \(expires in 9m5\ds\)", renewed.stdout), renewed.stdout
        committed = gpualloc("commit", reservation, *as_owner, home=home)
        assert committed.stdout == f"reservation/{reservation} committed\n", committed.stderr
        shown = gpualloc("describe", "reservation", reservation, "-s", address, home=home).stdout
        assert "State:           Committed" in shown and "Expires:         never" in shown
        as_yaml = gpualloc("get", "res", reservation, "-o", "yaml", "-s", address, home=home)
        (data,) = yaml.safe_load(as_yaml.stdout)["items"]
        assert data["claims"][0]["allocation"]["devices"]["results"][0]["driver"] == (
            "gpu.nvidia.com"
        )
    finally:
        released = gpualloc("release", reservation, *as_owner, home=home)
    assert released.stdout == f"reservation/{reservation} released\n", released.stderr
    gone = gpualloc("describe", "reservation", reservation, "-s", address, home=home)
    assert gone.returncode == 4


def test_what_allocate_and_get_print_reads_back_with_f(address: str, home: Path) -> None:
    """`allocate --reserve -o yaml` and `get reservations -o json|yaml` carry apiVersion and
    kind, and commit/release -f read the reservations back, as `kubectl delete -f` does."""
    as_owner = ("-s", address, "--as", "team-d/files")
    placed = gpualloc("allocate", "-f", ONE_H100, "--reserve", "-o", "yaml", *as_owner, home=home)
    assert placed.returncode == 0, placed.stderr
    placement = yaml.safe_load(placed.stdout)
    assert (placement["apiVersion"], placement["kind"]) == ("gpualloc.io/v1alpha1", "Placement")
    (reservation,) = placement["reservations"]
    assert (reservation["apiVersion"], reservation["kind"]) == (
        "gpualloc.io/v1alpha1",
        "Reservation",
    )
    (home / "placed.yaml").write_text(placed.stdout)
    committed = gpualloc("commit", "-f", str(home / "placed.yaml"), *as_owner, home=home)
    assert committed.stdout == f"reservation/{reservation['id']} committed\n", committed.stderr
    listed = gpualloc("get", "res", "--owner", "team-d/files", "-o", "json", *as_owner[:2],
                      home=home)  # fmt: skip
    (item,) = json.loads(listed.stdout)["items"]
    assert (item["apiVersion"], item["kind"], item["id"]) == (
        "gpualloc.io/v1alpha1", "Reservation", reservation["id"]
    )  # fmt: skip
    released = gpualloc("release", "-f", "-", *as_owner, home=home, stdin=listed.stdout)
    assert released.stdout == f"reservation/{reservation['id']} released\n", released.stderr


# long enough for three CLI runs (a Python start each) on a loaded 2-core machine: with 8 s the
# watch ended before the release on one run beside other suites
WATCH_FOR = "20s"


@pytest.mark.parametrize(
    "output", [pytest.param((), id="table"), pytest.param(("-o", "json"), id="json")]
)
def test_get_reservations_watch_prints_each_change(
    address: str, home: Path, output: tuple[str, ...]
) -> None:
    """get reservations -w: the list (none yet), then a line per change of the owner's
    reservations as it comes, until the --watch duration ends; with -o json each change is one
    compact camelCase object a line (`type`, `reservationId`, ...)."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith("GPUALLOC_")}
    owner = f"team-b/watcher-{len(output)}"
    watch = ("get", "reservations", "--owner", owner, "-w", WATCH_FOR, "-s", address, *output)
    watching = subprocess.Popen(
        [GPUALLOC, *watch],
        cwd=ROOT,
        env={**keep, "HOME": str(home), "XDG_CONFIG_HOME": ""},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert watching.stderr is not None
        assert watching.stderr.readline() == "No resources found.\n"  # the stream is open
        as_owner = ("-s", address, "--as", owner)
        done = gpualloc("allocate", "-f", ONE_H100, "--reserve", *as_owner, home=home)
        match = re.search(r"reservation/(\S+) reserved", done.stdout)
        assert match, done.stdout + done.stderr
        reservation = match[1]
        assert gpualloc("commit", reservation, *as_owner, home=home).returncode == 0
        assert gpualloc("release", reservation, *as_owner, home=home).returncode == 0
        out, err = watching.communicate(timeout=60)
    finally:
        watching.kill()
    assert watching.returncode == 0, err
    kinds = ("RESERVED", "COMMITTED", "RELEASED")
    if output:
        events = [json.loads(line) for line in out.splitlines()]
        assert [(e["type"], e["reservationId"], e["owner"]) for e in events] == [
            (kind, reservation, owner) for kind in kinds
        ]
        assert all(e["nodeName"].startswith("h100-node-") and e["fencingToken"] for e in events)
        assert all(line.startswith('{"type":') and " " not in line for line in out.splitlines())
        return
    lines = [line.split() for line in out.splitlines()]
    assert [line[:3] for line in lines] == [[kind, reservation, owner] for kind in kinds]
    assert all(line[3].startswith("h100-node-") for line in lines)


def test_a_held_mig_slice_blocks_the_slices_it_overlaps(address: str, home: Path) -> None:
    as_owner = ("-s", address, "--as", "team-b/mig")
    done = gpualloc("allocate", "-f", MIG, "--reserve", *as_owner, home=home)
    reservation = re.search(r"reservation/(\S+)", done.stdout)
    assert reservation, done.stdout + done.stderr
    try:
        blocked = gpualloc("get", "devices", "--node", "a100-node-1", "--state", "blocked",
                           "-o", "json", "-s", address, home=home)  # fmt: skip
        items = json.loads(blocked.stdout)["items"]
        assert items and {i["reservation"] for i in items} == {reservation[1]}
        assert all(i["expiresAt"] for i in items)  # the lease of the reservation in the way
        table = gpualloc("get", "devices", "--node", "a100-node-1", "--state", "blocked",
                         "-s", address, home=home).stdout  # fmt: skip
        rows = table.splitlines()[1:]
        assert rows and all(re.search(r"blocked\s+team-b/mig\s+in \d+m?\d+s$", r) for r in rows)
        nodes = gpualloc("get", "nodes", "a100-node-1", "-s", address, home=home).stdout
        counts = r"4\s+3\s+0\s+1\s+0\s+9\d/100"  # GPUS FREE TAINTED RESERVED COMMITTED MIG-FREE
        assert re.search(rf"a100-node-1\s+NVIDIA A100-SXM4-40GB\s+{counts}", nodes)
    finally:
        gpualloc("release", reservation[1], *as_owner, home=home)


def test_the_same_idempotency_key_gives_the_same_reservation(address: str, home: Path) -> None:
    argv = ("allocate", "-f", ONE_H100, "--reserve", "--idempotency-key", "cli-key-1")
    as_owner = ("-s", address, "--as", "team-c/retry")
    first, again = (gpualloc(*argv, *as_owner, home=home).stdout for _ in range(2))
    ids = [re.findall(r"reservation/(\S+) reserved", text) for text in (first, again)]
    try:
        assert len(ids[0]) == 1 and ids[0] == ids[1], (first, again)
        listed = gpualloc("get", "res", "--owner", "team-c/retry", "-o", "name", *as_owner[:2],
                          home=home)  # fmt: skip
        assert listed.stdout == f"reservation/{ids[0][0]}\n"
    finally:
        gpualloc("release", *ids[0], *as_owner, home=home)


def test_contexts_pick_the_server(address: str, home: Path) -> None:
    config = {"GPUALLOC_CONFIG": str(home / "gpualloc.yaml")}
    steps = [
        (("config", "set-context", "demo", "--server", address, "--owner", "ctx/me"), 0),
        (("config", "set-context", "nowhere", "--server", "127.0.0.1:1"), 0),
        (("config", "use-context", "demo"), 0),
        (("config", "use-context", "missing"), 4),
    ]
    for args, code in steps:
        assert gpualloc(*args, home=home, env=config).returncode == code, args
    contexts = gpualloc("config", "get-contexts", home=home, env=config).stdout
    assert re.search(rf"\*\s+demo\s+{re.escape(address)}\s+ctx/me", contexts), contexts
    view = yaml.safe_load(gpualloc("config", "view", home=home, env=config).stdout)
    assert view["current-context"] == "demo" and len(view["contexts"]) == 2
    assert gpualloc("get", "nodes", "-o", "name", home=home, env=config).stdout.count("node/") == 4
    other = gpualloc("get", "nodes", "--context", "nowhere", home=home, env=config)
    assert other.returncode == 1 and "127.0.0.1:1" in other.stderr
    # a variable wins over the context, a flag over the variable
    variable = {**config, "GPUALLOC_ALLOCATOR_ADDR": "127.0.0.1:1"}
    assert gpualloc("get", "nodes", home=home, env=variable).returncode == 1
    assert gpualloc("get", "nodes", "-s", address, home=home, env=variable).returncode == 0


def test_the_default_config_file_lives_under_home(address: str, home: Path) -> None:
    assert gpualloc("config", "set-context", "d", "--server", address, home=home).returncode == 0
    assert gpualloc("config", "use-context", "d", home=home).returncode == 0
    assert (home / ".config" / "gpualloc" / "config.yaml").exists()
    assert gpualloc("get", "nodes", home=home).returncode == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("contexts: 7\n", "needs a name", id="contexts-not-a-list"),
        pytest.param(
            "contexts:\n- name: a\n  context: {sever: x}\n",
            "unknown key 'sever'",
            id="unknown-context-key",
        ),  # fmt: skip
        pytest.param("kind: [\n", "not YAML", id="not-yaml"),
        pytest.param("colour: blue\n", "unknown field 'colour'", id="unknown-top-level-field"),
    ],
)
def test_a_bad_config_file_is_named(home: Path, text: str, message: str) -> None:
    path = home / "bad.yaml"
    path.write_text(text)
    done = gpualloc("get", "nodes", home=home, env={"GPUALLOC_CONFIG": str(path)})
    assert done.returncode == 2
    assert str(path) in done.stderr and message in done.stderr


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts_name_the_verbs(shell: str, home: Path) -> None:
    done = gpualloc("completion", shell, home=home)
    assert done.returncode == 0
    for word in ("describe", "reservations", "wide", "fragmentation-aware", "use-context"):
        assert word in done.stdout


@pytest.mark.parametrize(
    ("line", "words"),
    [
        pytest.param("gpualloc ", {"get", "describe", "allocate", "completion"}, id="verbs"),
        pytest.param("gpualloc get ", {"nodes", "devices", "reservations"}, id="get-resources"),
        pytest.param("gpualloc get nodes -o ", {"wide", "json", "yaml", "name"}, id="outputs"),
        pytest.param(
            "gpualloc allocate -f examples/claims/one",
            {"examples/claims/one-h100.yaml"},
            id="file-names",
        ),
        pytest.param("gpualloc get nodes h100", {"h100-node-1", "h100-node-2"}, id="node-names"),
        pytest.param("gpualloc describe node a100", {"a100-node-1"}, id="describe-node-names"),
        pytest.param("gpualloc get devices --node l40", {"l40s-node-1"}, id="node-flag"),
    ],
)
def test_bash_completes(line: str, words: set[str], home: Path, address: str) -> None:
    """Static words from the parser; node names from the server the shell's variables name
    (`gpualloc get nodes -o name` on TAB)."""
    script = gpualloc("completion", "bash", home=home).stdout
    (home / "completion.bash").write_text(script)
    probe = (
        f"source {home / 'completion.bash'}; COMP_LINE='{line}'; COMP_POINT=${{#COMP_LINE}};"
        f" read -ra COMP_WORDS <<< '{line}'; [[ '{line}' == *' ' ]] && COMP_WORDS+=('');"
        " COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _shtab_gpualloc;"
        " printf '%s\\n' \"${COMPREPLY[@]}\""
    )
    env = {
        "PATH": f"{Path(GPUALLOC).parent}:{os.environ['PATH']}",
        "HOME": str(home),
        "GPUALLOC_ALLOCATOR_ADDR": address,
    }
    done = subprocess.run(
        ["bash", "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=30, env=env
    )
    assert words <= set(done.stdout.split()), done.stdout + done.stderr


def test_allocate_each_claim_of_a_list_in_one_batch(address: str, home: Path) -> None:
    """`allocate -f` of a List of claims (a list of jobs, as kubectl reads a List): each on its
    own, in order, one AllocateBatch call: the two H100 claims are reserved on distinct
    devices, the 16-GPU one does not fit (exit 3). `--together` places a List's claims
    together, as one pod's (one reservation); `--each` does the former for any input."""
    one = yaml.safe_load((ROOT / ONE_H100).read_text())
    sixteen = yaml.safe_load((ROOT / SIXTEEN).read_text())
    items = [
        {**one, "metadata": {**one["metadata"], "name": "batch-a"}},
        {**one, "metadata": {**one["metadata"], "name": "batch-b"}},
        sixteen,
    ]
    listing = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items})
    as_owner = ("-s", address, "--as", "team-d/batch")
    done = gpualloc("allocate", "-f", "-", "--reserve", "-o", "json", *as_owner,
                    home=home, stdin=listing)  # fmt: skip
    shown = json.loads(done.stdout)
    ids = [r["id"] for item in shown for r in item.get("reservations", [])]
    try:
        assert done.returncode == 3, done.stderr
        assert [item["claim"] for item in shown] == [
            "default/batch-a", "default/batch-b", f"default/{sixteen['metadata']['name']}"
        ]  # fmt: skip
        assert len(ids) == 2
        devices = gpualloc("get", "devices", "--state", "reserved", "-o", "json", "-s", address,
                           home=home)  # fmt: skip
        held = {(d["nodeName"], d["device"]) for d in json.loads(devices.stdout)["items"]
                if d.get("owner") == "team-d/batch"}  # fmt: skip
        assert len(held) == 2
        pair = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items[:2]})
        together = gpualloc("allocate", "-f", "-", "--together", "--reserve", "-o", "json",
                            *as_owner, home=home, stdin=pair)  # fmt: skip
        assert together.returncode == 0, together.stderr
        placed = json.loads(together.stdout)
        ids += [r["id"] for r in placed["reservations"]]
        assert len(placed["reservations"]) == 1 and len(placed["claims"]) == 2
        both = gpualloc("allocate", "-f", "-", "--each", "--together", *as_owner, home=home,
                        stdin=pair)  # fmt: skip
        assert both.returncode == 2 and "--each" in both.stderr
    finally:
        for reservation in ids:
            gpualloc("release", reservation, *as_owner, home=home)
