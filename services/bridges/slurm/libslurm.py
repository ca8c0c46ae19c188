"""`scontrol show job -d` without starting scontrol: Slurm's own C API, in the hooks service.

slurmctld gives a PrologSlurmctld no GPU variable, so the prolog reads the GPU ids Slurm picked
from the job's details (`GRES=gpu:h100:3(IDX:0,6-7)` per node). Starting scontrol for that
costs each prolog ~9 ms and ~5 ms of CPU here; the long-running `gpualloc-slurm sync` asks
slurmctld itself through libslurm, the library scontrol is built on (the same two calls
scontrol makes: `slurm_load_job(…, SHOW_DETAIL)`, then `slurm_sprint_job_info`, so the text is
byte for byte scontrol's; tests/slurm compares them): ~1.6 ms and ~0.5 ms of CPU.

The prologs of one scheduling pass come together, and slurmctld answers their RPCs one after
the other while it is busy starting that pass (a wave of 8 read its ids in 2 to 25 ms, the
last waiting for the seven before it). So the reads are batched like the reservations
(batching.py): a prolog that finds no read in flight reads at once; those that come meanwhile
are read by the next one: with one `slurm_load_jobs(…, SHOW_DETAIL)` (every job slurmctld
lists, printed by `slurm_print_job_info_msg`, the same text per job as
`slurm_sprint_job_info`) when slurmctld lists at most LOAD_ALL_JOBS_PER_ASK jobs per job
asked, else one job at a time. Reading every job costs about 0.1 ms per job listed, most of it
printing them in this process (17 ms and 8 ms of CPU for ~150 jobs, in a benchmark run), and a
single read 2 to 4 ms while slurmctld starts a wave: with a long queue the single reads are
cheaper. The count slurmctld lists is learnt from a read of every job, again after
LISTED_MAX_AGE_SECONDS.

Only the stable part of Slurm's API is used: `slurm_init`, `slurm_load_job`,
`slurm_load_jobs`, `slurm_sprint_job_info`, `slurm_print_job_info_msg`,
`slurm_free_job_info_msg`, `xfree_ptr`, and the `job_info_msg_t` header (two `time_t`, a
`uint32_t`, the records' pointer), the same in 22.05, 23.11 and 25.05; and libc's
`open_memstream`. The library is GPUALLOC_LIBSLURM, else Debian's libslurmfull.so or the
upstream install's libslurm.so; when none loads, or a call fails, the caller runs scontrol as
before (`JobDetails.show` answers None). One read at a time per process.
"""

from __future__ import annotations

import ctypes
import logging
import re
import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LIBRARIES", "JobDetails"]

log = logging.getLogger("gpualloc.slurm.libslurm")

LIBRARIES = (
    "/usr/lib/x86_64-linux-gnu/slurm-wlm/libslurmfull.so",  # Debian, Ubuntu (slurm-wlm)
    "/usr/lib/aarch64-linux-gnu/slurm-wlm/libslurmfull.so",
    "/usr/lib64/slurm/libslurmfull.so",  # upstream RPMs
    "/usr/lib/slurm/libslurmfull.so",
    "libslurm.so",  # the public one, where installed
)
SHOW_DETAIL = 0x0002
SLURM_SUCCESS = 0
LOAD_ALL_JOBS_PER_ASK = 10
"""A batch is read with one read of every job when slurmctld lists at most this many jobs per
job asked (its last answer), else one job at a time (the module docstring)."""
LISTED_MAX_AGE_SECONDS = 30.0
_JOB_START = re.compile(r"^JobId=(\d+) ", re.MULTILINE)


class _JobInfoMsg(ctypes.Structure):
    _fields_ = (
        ("last_backfill", ctypes.c_long),
        ("last_update", ctypes.c_long),
        ("record_count", ctypes.c_uint32),
        ("job_array", ctypes.c_void_p),
    )


@dataclass
class _Ask:
    job_id: str
    answered: bool = False
    text: str | None = None


class JobDetails:
    """`show(job_id)`: `scontrol show job -d <id>`'s text, from libslurm; None when the
    library is not there or the call failed (run scontrol then). Concurrent calls are read
    together (the module docstring)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = dict(environ)
        self._lock = threading.Lock()  # the library: one call at a time
        self._lib: ctypes.CDLL | None = None
        self._libc: ctypes.CDLL | None = None
        self._tried = False
        self._changed = threading.Condition()
        self._queue: list[_Ask] = []
        self._busy = False
        self.listed = 0
        """How many jobs slurmctld listed at the last read of them all."""
        self._listed_at = -LISTED_MAX_AGE_SECONDS
        self.reads = 0
        """RPCs made (a batch read of every job counts one)."""

    def _load(self) -> ctypes.CDLL | None:
        if self._tried:
            return self._lib
        self._tried = True
        conf = self._environ.get("SLURM_CONF", "").strip() or "/etc/slurm/slurm.conf"
        if not Path(conf).is_file():
            log.info("no %s: the prolog reads Slurm's GPU ids with scontrol", conf)
            return None
        wanted = self._environ.get("GPUALLOC_LIBSLURM", "").strip()
        for path in (wanted,) if wanted else LIBRARIES:
            try:
                # RTLD_GLOBAL: Slurm's plugins (auth_munge.so) resolve the library's symbols
                lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                continue
            info = ctypes.POINTER(ctypes.POINTER(_JobInfoMsg))
            lib.slurm_init.argtypes = (ctypes.c_char_p,)
            lib.slurm_init.restype = None
            lib.slurm_load_job.argtypes = (info, ctypes.c_uint32, ctypes.c_uint16)
            lib.slurm_load_job.restype = ctypes.c_int
            lib.slurm_load_jobs.argtypes = (ctypes.c_long, info, ctypes.c_uint16)
            lib.slurm_load_jobs.restype = ctypes.c_int
            lib.slurm_sprint_job_info.argtypes = (ctypes.c_void_p, ctypes.c_int)
            lib.slurm_sprint_job_info.restype = ctypes.c_void_p
            lib.slurm_print_job_info_msg.argtypes = (
                ctypes.c_void_p,
                ctypes.POINTER(_JobInfoMsg),
                ctypes.c_int,
            )
            lib.slurm_print_job_info_msg.restype = None
            lib.slurm_free_job_info_msg.argtypes = (ctypes.POINTER(_JobInfoMsg),)
            lib.slurm_free_job_info_msg.restype = None
            lib.xfree_ptr.argtypes = (ctypes.c_void_p,)
            lib.xfree_ptr.restype = None
            lib.slurm_init(conf.encode())
            log.info("Slurm's GPU ids from %s (no scontrol per prolog)", path)
            self._lib = lib
            self._libc = _libc()
            return lib
        log.info("no libslurm (GPUALLOC_LIBSLURM): the prolog reads Slurm's GPU ids with scontrol")
        return None

    def load(self) -> bool:
        """Load the library now (a service's start), not on the first prolog; False when
        there is none (scontrol then)."""
        with self._lock:
            return self._load() is not None

    def show(self, job_id: str) -> str | None:
        if not job_id.isdigit():
            return None
        ask = _Ask(job_id)
        with self._changed:
            self._queue.append(ask)
            while not ask.answered:
                if self._busy:
                    self._changed.wait()
                    continue
                self._busy = True
                batch, self._queue = self._queue, []
                self._changed.release()
                found: Mapping[str, str] = {}
                try:
                    found = self._read({a.job_id for a in batch})
                finally:  # a failed read: None, and scontrol says why
                    self._changed.acquire()
                    for asked in batch:
                        asked.text, asked.answered = found.get(asked.job_id), True
                    self._busy = False
                    self._changed.notify_all()
        return ask.text

    def _read(self, job_ids: Collection[str]) -> dict[str, str]:
        """The jobs' texts (those slurmctld answered for): one RPC for one job, one for all
        jobs when several are asked and slurmctld's list is not too long."""
        with self._lock:
            lib = self._load()
            if lib is None:
                return {}
            known = time.monotonic() - self._listed_at < LISTED_MAX_AGE_SECONDS
            few = not known or self.listed <= len(job_ids) * LOAD_ALL_JOBS_PER_ASK
            if len(job_ids) > 1 and self._libc is not None and few:
                return self._read_all(lib, self._libc, job_ids)
            found = {}
            for job_id in job_ids:
                text = self._read_one(lib, job_id)
                if text is not None:
                    found[job_id] = text
            return found

    def _read_one(self, lib: ctypes.CDLL, job_id: str) -> str | None:
        reply = ctypes.POINTER(_JobInfoMsg)()
        self.reads += 1
        if lib.slurm_load_job(ctypes.byref(reply), int(job_id), SHOW_DETAIL) != SLURM_SUCCESS:
            return None  # scontrol then says why (an unknown job, slurmctld down)
        try:
            if reply.contents.record_count < 1 or not reply.contents.job_array:
                return None
            text = lib.slurm_sprint_job_info(reply.contents.job_array, 0)
            if not text:
                return None
            try:
                return ctypes.string_at(text).decode(errors="replace")
            finally:
                lib.xfree_ptr(text)
        finally:
            lib.slurm_free_job_info_msg(reply)

    def _read_all(
        self, lib: ctypes.CDLL, libc: ctypes.CDLL, job_ids: Collection[str]
    ) -> dict[str, str]:
        """Every job slurmctld lists, printed as scontrol prints them, the asked ones kept."""
        reply = ctypes.POINTER(_JobInfoMsg)()
        self.reads += 1
        if lib.slurm_load_jobs(0, ctypes.byref(reply), SHOW_DETAIL) != SLURM_SUCCESS:
            return {}
        try:
            self.listed, self._listed_at = reply.contents.record_count, time.monotonic()
            buffer, size = ctypes.c_void_p(), ctypes.c_size_t()
            stream = libc.open_memstream(ctypes.byref(buffer), ctypes.byref(size))
            if not stream:
                return {}
            try:
                lib.slurm_print_job_info_msg(stream, reply, 0)
            finally:
                libc.fclose(stream)  # sets buffer and size
            try:
                text = ctypes.string_at(buffer, size.value).decode(errors="replace")
            finally:
                libc.free(buffer)
        finally:
            lib.slurm_free_job_info_msg(reply)
        return {job_id: block for job_id, block in job_texts(text) if job_id in job_ids}


def job_texts(printed: str) -> list[tuple[str, str]]:
    """(job id, its text) of each job in `slurm_print_job_info_msg`'s output: a header line,
    then each job's `slurm_sprint_job_info` text, which begins with `JobId=<id> `."""
    starts = [(m.start(), m[1]) for m in _JOB_START.finditer(printed)]
    ends = [start for start, _ in starts[1:]] + [len(printed)]
    return [(job_id, printed[start:end]) for (start, job_id), end in zip(starts, ends, strict=True)]


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        libc.open_memstream.argtypes = (
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(ctypes.c_size_t),
        )
        libc.open_memstream.restype = ctypes.c_void_p
        libc.fclose.argtypes = (ctypes.c_void_p,)
        libc.fclose.restype = ctypes.c_int
        libc.free.argtypes = (ctypes.c_void_p,)
        libc.free.restype = None
    except (OSError, AttributeError):
        return None  # one RPC per job then
    return libc
