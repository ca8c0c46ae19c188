"""`scontrol show job -d` without starting scontrol: Slurm's own C API, in the hooks service.

slurmctld gives a PrologSlurmctld no GPU variable, so the prolog reads the GPU ids Slurm picked
from the job's details (`GRES=gpu:h100:3(IDX:0,6-7)` per node). Starting scontrol for that
costs each prolog ~9 ms and ~5 ms of CPU here; the long-running `gpualloc-slurm sync` asks
slurmctld itself through libslurm, the library scontrol is built on (the same two calls
scontrol makes: `slurm_load_job(…, SHOW_DETAIL)`, then `slurm_sprint_job_info`, so the text is
byte for byte scontrol's; tests/slurm compares them): ~1.6 ms and ~0.5 ms of CPU.

Only the stable part of Slurm's API is used: `slurm_init`, `slurm_load_job`,
`slurm_sprint_job_info`, `slurm_free_job_info_msg`, `xfree_ptr`, and the `job_info_msg_t`
header (two `time_t`, a `uint32_t`, the records' pointer), the same in 22.05, 23.11 and 25.05. The
library is GPUALLOC_LIBSLURM, else Debian's libslurmfull.so or the upstream install's
libslurm.so; when none loads, or a call fails, the caller runs scontrol as before
(`JobDetails.show` answers None). Calls are serialized (one at a time per process).
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Mapping
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


class _JobInfoMsg(ctypes.Structure):
    _fields_ = (
        ("last_backfill", ctypes.c_long),
        ("last_update", ctypes.c_long),
        ("record_count", ctypes.c_uint32),
        ("job_array", ctypes.c_void_p),
    )


class JobDetails:
    """`show(job_id)`: `scontrol show job -d <id>`'s text, from libslurm; None when the
    library is not there or the call failed (run scontrol then)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = dict(environ)
        self._lock = threading.Lock()
        self._lib: ctypes.CDLL | None = None
        self._tried = False

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
            lib.slurm_init.argtypes = (ctypes.c_char_p,)
            lib.slurm_init.restype = None
            lib.slurm_load_job.argtypes = (
                ctypes.POINTER(ctypes.POINTER(_JobInfoMsg)),
                ctypes.c_uint32,
                ctypes.c_uint16,
            )
            lib.slurm_load_job.restype = ctypes.c_int
            lib.slurm_sprint_job_info.argtypes = (ctypes.c_void_p, ctypes.c_int)
            lib.slurm_sprint_job_info.restype = ctypes.c_void_p
            lib.slurm_free_job_info_msg.argtypes = (ctypes.POINTER(_JobInfoMsg),)
            lib.slurm_free_job_info_msg.restype = None
            lib.xfree_ptr.argtypes = (ctypes.c_void_p,)
            lib.xfree_ptr.restype = None
            lib.slurm_init(conf.encode())
            log.info("Slurm's GPU ids from %s (no scontrol per prolog)", path)
            self._lib = lib
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
        with self._lock:
            lib = self._load()
            if lib is None:
                return None
            reply = ctypes.POINTER(_JobInfoMsg)()
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
