"""Slurm's GPU request syntax, on the examples of Slurm's own documentation."""

from __future__ import annotations

import re
import shlex
from datetime import datetime

import pytest

from services.bridges.slurm.hostlist import expand_hostlist
from services.bridges.slurm.request import (
    GpuGres,
    SlurmGpuRequest,
    constraint_wants_nvlink,
    gpu_ids_from_job_details,
    parse_gpu_ids,
    parse_gres,
    request_from_environ,
    request_from_options,
    submit_time_from_job_details,
    with_types,
)
from services.common.errors import InvalidArgument
from tests.unit.bridges.support import DATA

SLURM = DATA / "slurm"
_FLAG = re.compile(r"^(--gres|--gpus-per-node|--gpus|--constraint|-N)=?(.*)$")


def doc_lines() -> dict[str, str]:
    """`file:line` -> the documented text (tests/data/slurm/gpu-requests.txt)."""
    lines = {}
    for line in (SLURM / "gpu-requests.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            where, text = line.split("\t", 1)
            lines[where] = text
    return lines


def flags(text: str) -> list[dict[str, str]]:
    """Every sbatch/srun request in a documented line (a line may quote several)."""
    found: list[dict[str, str]] = []
    words = shlex.split(text.replace("&", " & ").replace(" & ", "&"), posix=True)
    current: dict[str, str] = {}
    for word in words:
        match = _FLAG.match(word.strip('".,'))
        if match is None:
            continue
        name, value = match.group(1).lstrip("-"), match.group(2).strip('".,')
        if name in current:
            found.append(current)
            current = {}
        current[name.replace("-", "_")] = value
    return [*found, current] if current else found


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        pytest.param("doc/html/gres.shtml:100", [((GpuGres("kepler", 2),), 1)], id="gres-typed"),
        pytest.param(
            "doc/html/gres.shtml:148", [((GpuGres(None, 4),), 1)], id="gres-count-one-node"
        ),
        pytest.param("doc/html/gres.shtml:150", [((GpuGres(None, 2),), 1)], id="srun-step-gres"),
        pytest.param("doc/html/gres.shtml:388", [((GpuGres(None, 2),), 1)], id="gpus-per-job"),
        pytest.param("doc/man/man1/sbatch.1:1170", [((GpuGres("volta", 3),), 1)], id="gpus-typed"),
        pytest.param(
            "doc/man/man1/sbatch.1:1184", [((GpuGres("volta", 3),), 1)], id="gpus-per-node"
        ),
        pytest.param(
            "doc/man/man1/sbatch.1:1186",
            [((GpuGres("volta", 3), GpuGres("kepler", 1)), 1)],
            id="gpus-per-node-two-types",
        ),
        pytest.param(
            "doc/man/man1/sbatch.1:1243",
            [((GpuGres(None, 2),), 1), ((GpuGres("kepler", 2),), 1)],
            id="gres-examples",
        ),
    ],
)
def test_documented_requests(where, expected):
    requests = []
    for given in flags(doc_lines()[where]):
        nodes = int(given.pop("N", "1").split("-")[0])
        requests.append(
            request_from_options(
                gres=given.get("gres"),
                gpus=given.get("gpus"),
                gpus_per_node=given.get("gpus_per_node"),
                nodes=nodes,
            )
        )
    assert [(r.per_node, r.nodes) for r in requests] == expected


@pytest.mark.parametrize(
    ("where", "feature", "required"),
    [
        pytest.param("doc/man/man1/sbatch.1:300", "intel", True, id="single-feature"),
        pytest.param("doc/man/man1/sbatch.1:321", "gpu", True, id="and"),
        pytest.param("doc/man/man1/sbatch.1:348", "rack1", False, id="matching-or"),
        pytest.param("doc/man/man1/sbatch.1:397", "foo", False, id="and-then-or-left"),
        pytest.param("doc/man/man1/sbatch.1:397", "baz", False, id="and-then-or-right"),
        pytest.param("doc/man/man1/sbatch.1:398", "foo", False, id="or-then-and-left"),
        pytest.param("doc/man/man1/sbatch.1:398", "baz", True, id="or-then-and-anded-with-all"),
        pytest.param("doc/man/man1/sbatch.1:400", "foo", True, id="and-group"),
        pytest.param("doc/man/man1/sbatch.1:400", "bar", False, id="or-inside-group"),
    ],
)
def test_nvlink_as_a_constraint_feature(where, feature, required):
    (given,) = flags(doc_lines()[where])
    expression = re.sub(rf"\b{feature}\b", "nvlink", given["constraint"])
    assert constraint_wants_nvlink(expression) is required


def slurm_conf_gres() -> dict[str, str]:
    """NodeName -> Gres= value of tests/data/slurm/slurm-conf-gres.conf."""
    found = {}
    for line in (SLURM / "slurm-conf-gres.conf").read_text().splitlines():
        match = re.match(r"^NodeName=(\S+) [Gg]res=(\S+)$", line)
        if match:
            found[match[1]] = match[2]
    return found


@pytest.mark.parametrize(
    ("nodes", "gres", "hosts"),
    [
        pytest.param(
            "tux[0-7]", (GpuGres("tesla", 2), GpuGres("kepler", 2)), 8, id="other-gres-are-slurms"
        ),
        pytest.param(
            "tux[1-16]", (GpuGres("a100", 1), GpuGres("a100_3g.20gb", 2)), 16, id="mig-types"
        ),
    ],
)
def test_documented_node_gres(nodes, gres, hosts):
    assert parse_gres(slurm_conf_gres()[nodes]) == gres
    assert len(expand_hostlist(nodes)) == hosts


@pytest.mark.parametrize(
    ("gres", "model", "profile"),
    [
        pytest.param(GpuGres("a100_3g.20gb", 1), "a100", "3g.20gb", id="slurm-mig-type"),
        pytest.param(
            GpuGres("nvidia_a100_3g.20gb", 1), "nvidia_a100", "3g.20gb", id="autodetect-name"
        ),
        pytest.param(GpuGres("3g.20gb", 1), None, "3g.20gb", id="bare-profile"),
        pytest.param(GpuGres("H100", 1), "h100", None, id="model"),
        pytest.param(GpuGres(None, 1), None, None, id="untyped"),
    ],
)
def test_types_split_into_model_and_mig_profile(gres, model, profile):
    assert (gres.model, gres.mig_profile) == (model, profile)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param(
            {"SLURM_JOB_GRES": "gpu:h100:4", "SLURM_JOB_CONSTRAINTS": "nvlink"},
            SlurmGpuRequest((GpuGres("h100", 4),), 1, True),
            id="site-exported-gres",
        ),
        pytest.param(
            {"SLURM_GPUS_PER_NODE": "a100:2", "SLURM_JOB_NUM_NODES": "2"},
            SlurmGpuRequest((GpuGres("a100", 2),), 2, False),
            id="gpus-per-node-task-prolog",
        ),
        pytest.param(
            {"SLURM_GPUS": "a100:4", "SLURM_NNODES": "2", "GPUALLOC_NVLINK": "yes"},
            SlurmGpuRequest((GpuGres("a100", 2),), 2, True),
            id="gpus-split-over-nodes",
        ),
        pytest.param(
            {"SLURM_JOB_GPUS": "0,1,3"},
            SlurmGpuRequest((GpuGres(None, 3),), 1, False, (0, 1, 3)),
            id="prolog-gpu-ids-counted",
        ),
        pytest.param({"SLURM_JOB_ID": "7"}, SlurmGpuRequest((), 1, False), id="no-gpus"),
    ],
)
def test_request_from_the_prolog_environment(environ, expected):
    assert request_from_environ(environ) == expected


@pytest.mark.parametrize(
    ("options", "path"),
    [
        pytest.param({"gpus": "a100:3", "nodes": 2}, "--gpus", id="uneven-split"),
        pytest.param({"gres": "gpu:h100:zero"}, "--gres", id="bad-count"),
        pytest.param({"gres": "gpu:a:b:c"}, "--gres", id="too-many-fields"),
        pytest.param({"gpus_per_node": "volta:0"}, "--gpus-per-node", id="zero"),
        pytest.param({"gres": "gpu:1", "nodes": 0}, "--nodes", id="no-nodes"),
    ],
)
def test_bad_requests_name_the_option(options, path):
    with pytest.raises(InvalidArgument) as raised:
        request_from_options(**options)
    assert raised.value.field_path == path


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        pytest.param(
            "h100-node-[1-2],a100-node-1",
            ["h100-node-1", "h100-node-2", "a100-node-1"],
            id="range-and-single",
        ),
        pytest.param("gpu[08-10]", ["gpu08", "gpu09", "gpu10"], id="zero-padding"),
        pytest.param("tux[0,2-3]", ["tux0", "tux2", "tux3"], id="list-in-brackets"),
        pytest.param("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"], id="two-groups"),
    ],
)
def test_hostlists(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize("hostlist", ["tux[1-2", "tux]1", "tux[3-1]", "tux[a-b]"])
def test_bad_hostlists(hostlist):
    with pytest.raises(InvalidArgument):
        expand_hostlist(hostlist)


@pytest.mark.parametrize(
    ("ids", "types", "expected"),
    [
        pytest.param(
            (0, 1, 4),
            ["a100", "a100", "a100", "a100_3g.20gb", "a100_3g.20gb"],
            (GpuGres("a100", 2), GpuGres("a100_3g.20gb", 1)),
            id="whole-and-mig-lines",
        ),
        pytest.param((0, 9), ["h100"] * 8, (GpuGres(None, 2),), id="unknown-id-keeps-the-count"),
    ],
)
def test_slurm_gpu_ids_take_the_types_of_their_gres_conf_lines(ids, types, expected):
    request = SlurmGpuRequest((GpuGres(None, len(ids)),), 1, False, ids)
    assert with_types(request, types).per_node == expected


def test_gpu_ids_per_node_from_real_scontrol_show_job_d():
    text = (SLURM / "scontrol-show-job-d.txt").read_text()
    jobs = ["JobId=" + part for part in text.split("JobId=")[1:]]
    found = [gpu_ids_from_job_details(job) for job in jobs]
    assert found == [{"h100-node-1": (0, 6, 7)}, {"h100-node-1": (1,)}, {"h100-node-1": (2, 3)}]


@pytest.mark.parametrize(
    ("details", "expected"),
    [
        pytest.param(
            "   JOB_GRES=gpu:h100:4\n     Nodes=h100-node-[1-2] CPU_IDs=0-1 Mem=0 "
            "GRES=gpu:h100:2(IDX:0-1)\n",
            {"h100-node-1": (0, 1), "h100-node-2": (0, 1)},
            id="a-hostlist-shares-one-line",
        ),
        pytest.param(
            "     Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu:a100:1(IDX:3),gpu:a100_1g.5gb:2(IDX:4-5)\n",
            {"n1": (3, 4, 5)},
            id="two-gpu-entries",
        ),
        pytest.param(
            "     Nodes=n1 CPU_IDs=0 Mem=0 GRES=shard:2(IDX:0),gpu:1(IDX:2)\n",
            {"n1": (2,)},
            id="other-gres-ignored",
        ),
        pytest.param("     Nodes=n1 CPU_IDs=0 Mem=0 GRES=\n", {}, id="no-gpu"),
        pytest.param("     Nodes=n1 CPU_IDs=0 Mem=0\n", {}, id="no-gres-field"),
        pytest.param("   NodeList=n1\n   ReqNodeList=(null)\n", {}, id="not-a-detail-line"),
    ],
)
def test_gpu_ids_from_job_details(details, expected):
    assert gpu_ids_from_job_details(details) == expected


def test_submit_time_from_real_scontrol_show_job_d():
    text = (SLURM / "scontrol-show-job-d.txt").read_text()
    jobs = ["JobId=" + part for part in text.split("JobId=")[1:]]
    local = datetime(2026, 12, 1, 20, 3, 6).timestamp()  # scontrol prints local time
    assert [submit_time_from_job_details(job) for job in jobs] == [local] * 3


@pytest.mark.parametrize(
    ("details", "expected"),
    [
        pytest.param(
            "   SubmitTime=2026-12-06T09:41:45 EligibleTime=2026-12-06T09:41:46\n",
            datetime(2026, 12, 6, 9, 41, 45).timestamp(),
            id="submit-not-eligible",
        ),
        pytest.param("   SubmitTime=Unknown EligibleTime=Unknown\n", None, id="unknown"),
        pytest.param("   EligibleTime=2026-12-06T09:41:46\n", None, id="no-submit-time"),
        pytest.param("   LastSubmitTime=2026-12-06T09:41:45\n", None, id="not-another-field"),
    ],
)
def test_submit_time_from_job_details(details, expected):
    assert submit_time_from_job_details(details) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("0,6,7", (0, 6, 7), id="env-list"),
        pytest.param("0,6-7", (0, 6, 7), id="idx-range"),
        pytest.param("", (), id="empty"),
        pytest.param("3", (3,), id="one"),
    ],
)
def test_gpu_ids(text, expected):
    assert parse_gpu_ids(text) == expected


@pytest.mark.parametrize("text", ["0,a", "1-", "0,0", "-1", "N/A"])
def test_bad_gpu_ids(text):
    with pytest.raises(InvalidArgument, match="SLURM_JOB_GPUS"):
        parse_gpu_ids(text)
