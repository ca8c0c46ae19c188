"""`gpualloc policy check` run for real (the console entry, in a subprocess): a policy given as
Kueue objects is checked as a server loads it, what is left out is listed, every violation is
printed naming the file, object and field, and `-o yaml` writes the quotas in gpualloc's own
form, which loads to the same quotas."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from services.common.security.policy import parse_policy
from services.common.security.policy_files import load_policy

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "security"


def gpualloc_policy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", "policy", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )


def test_a_valid_policy_of_kueue_objects_and_what_it_leaves_out() -> None:
    done = gpualloc_policy("check", "examples/security/quotas-kueue.yml")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "examples/security/quotas-kueue.yml: valid: 4 tenants (3 with quotas), 2 bindings, "
        "quotas from Kueue objects",
        "  Kueue quotas of resources gpualloc does not allocate, not enforced: cpu (team-a, "
        "team-b); memory (team-a, team-b)",
        "  Kueue objects without quota, left to Kueue: LocalQueue team-a/gpus, LocalQueue "
        "team-b/gpus",
    ]


def test_the_native_form_it_writes_loads_to_the_same_quotas(tmp_path: Path) -> None:
    for output in ("yaml", "json"):
        done = gpualloc_policy("check", "examples/security/quotas-kueue.yml", "-o", output)
        assert done.returncode == 0, done.stderr
        written = yaml.safe_load(done.stdout)  # JSON is YAML
        assert "kueue" not in written["spec"]["quota"]
        from_kueue = load_policy(
            str(EXAMPLES / "quotas-kueue.yml"), (EXAMPLES / "quotas-kueue.yml").read_bytes()
        ).policy
        native = parse_policy(written)
        assert native.quotas == from_kueue.quotas
        assert native.tenants == from_kueue.tenants and native.bindings == from_kueue.bindings
    done = gpualloc_policy("check", "examples/security/quotas-native.yml", "-o", "yaml")
    assert yaml.safe_load(done.stdout) == yaml.safe_load(
        (EXAMPLES / "quotas-native.yml").read_text()
    )


def test_every_violation_is_printed_and_exits_2(tmp_path: Path) -> None:
    shutil.copytree(EXAMPLES / "kueue", tmp_path / "kueue")
    shutil.copy(EXAMPLES / "quotas-kueue.yml", tmp_path / "policy.yml")
    queues = tmp_path / "kueue" / "queues.yml"
    text = queues.read_text().replace("cohortName: research", "cohortName: Research", 1)
    queues.write_text(text.replace("withinClusterQueue: LowerPriority", "withinClusterQueue: Low"))
    done = gpualloc_policy("check", str(tmp_path / "policy.yml"))
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert [tuple(line.split(": ")[:5]) for line in lines] == [
        ("gpualloc policy", str(tmp_path / "policy.yml"), f"kueue/queues.yml[{i}]", queue, path)
        for i, queue, path in [
            (0, "ClusterQueue team-a", "spec.cohortName"),
            (0, "ClusterQueue team-a", "spec.preemption.withinClusterQueue"),
            (1, "ClusterQueue team-b", "spec.preemption.withinClusterQueue"),
            (2, "ClusterQueue hpc", "spec.preemption.withinClusterQueue"),
        ]
    ]
    assert "Traceback" not in done.stderr
    missing = gpualloc_policy("check", str(tmp_path / "nothing.yml"))
    assert missing.returncode == 2 and "No such file" in missing.stderr
