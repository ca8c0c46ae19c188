"""`make test` on a fresh machine (issue 28): .ci/test-deps, which the `test` target and .ci/run
run first, installs the real parts the suite starts when it can, else stops with one line
saying what to install. Run here with PATH holding only the programs a case gives it
(GPUALLOC_TEST_INSTALL=no: it never installs), so each case sees a machine that lacks the rest.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / ".ci" / "test-deps"
PROGRAMS = {  # program -> Debian package, as README's "The two commands" lists them
    "redis-server": "redis-server",
    "redis-sentinel": "redis-sentinel",
    "redis-cli": "redis-tools",
    "slurmctld": "slurm-wlm",
    "slurmd": "slurm-wlm",
    "munged": "munge",
    "chromium": "chromium",
    "chromedriver": "chromium-driver",
}
SBIN = ("/usr/sbin", "/sbin")  # the script looks there too (slurmctld, munged live there)


def _run(tmp_path: Path, present: set[str]) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("id",):
        (bin_dir / tool).symlink_to(str(shutil.which(tool)))
    for program in present:
        stub = bin_dir / program
        stub.write_text("#!/bin/sh\n")
        stub.chmod(0o755)
    env = {"PATH": str(bin_dir), "GPUALLOC_TEST_INSTALL": "no", "HOME": str(tmp_path)}
    return subprocess.run(
        ["/bin/bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30
    )


def _in_sbin(program: str) -> bool:
    return any(os.access(Path(d) / program, os.X_OK) for d in SBIN)


@pytest.mark.parametrize(
    "absent",
    [
        pytest.param({"chromedriver"}, id="no-chromedriver"),
        pytest.param({"redis-sentinel", "chromium", "chromedriver"}, id="no-sentinel-no-chromium"),
        pytest.param(set(PROGRAMS), id="nothing"),
    ],
)
def test_a_missing_real_part_stops_make_test_in_one_line(tmp_path: Path, absent: set[str]) -> None:
    done = _run(tmp_path, set(PROGRAMS) - absent)
    missing = {PROGRAMS[p] for p in absent if not _in_sbin(p)}
    assert done.returncode == 1 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    match = re.fullmatch(r"make test needs ([a-z -]+): apt-get install \1 \(as root; .*\)", line)
    assert match and set(match[1].split()) == missing, line


def test_a_machine_with_every_real_part_goes_on(tmp_path: Path) -> None:
    done = _run(tmp_path, set(PROGRAMS))
    if os.geteuid() == 0:
        assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    else:
        assert done.returncode == 1 and done.stderr.startswith("make test needs root")


def test_make_test_and_ci_run_check_first() -> None:
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^test:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert target and target[1].splitlines()[0].strip() == ".ci/test-deps"
    assert ".ci/test-deps" in (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert all(f"`{package}`" in readme for package in PROGRAMS.values())
