#!/usr/bin/python3 -IS
"""The Slurm scripts' client of `gpualloc-slurm sync --socket` (services/bridges/slurm/hooks.py).

    gpualloc-hook.py prolog | task-prolog | epilog --all-nodes --sweep   (as gpualloc-slurm)

Hands its arguments and the job's SLURM_* environment to the service on the Unix socket
GPUALLOC_SLURM_SOCKET (default /run/gpualloc-slurm.sock), then prints the answer and exits
with its status: the service does the work, so a hook costs a `python3 -I -S` start of the
standard library (milliseconds), not a start of gpualloc's Python. When nothing listens on the
socket (the service restarts), it runs GPUALLOC_SLURM_CLI (default
/opt/gpualloc/bin/gpualloc-slurm) with the same arguments instead: the same work, slower.
Standard library only, on purpose: copy it next to the scripts (/etc/slurm/gpualloc/).
"""

import json
import os
import socket
import sys

SOCKET = "/run/gpualloc-slurm.sock"
CLI = "/opt/gpualloc/bin/gpualloc-slurm"
EXIT_FAILED = 3
TIMEOUT_SECONDS = 300.0  # the service bounds its own calls; this bounds a service that hangs


def main() -> int:
    argv = sys.argv[1:]
    path = os.environ.get("GPUALLOC_SLURM_SOCKET") or SOCKET
    env = {k: v for k, v in os.environ.items() if k.startswith("SLURM") or k == "GPUALLOC_NVLINK"}
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        cli = os.environ.get("GPUALLOC_SLURM_CLI") or CLI
        try:
            os.execv(cli, [cli, *argv])
        except OSError as error:
            print(f"gpualloc-hook: {path} does not answer and {cli}: {error}", file=sys.stderr)
            return EXIT_FAILED
    try:
        sock.settimeout(TIMEOUT_SECONDS)
        sock.sendall(json.dumps({"argv": argv, "env": env}).encode())
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        answer = json.loads(data.decode())
        code = int(answer["code"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"gpualloc-hook: {path}: no answer: {error}", file=sys.stderr)
        return EXIT_FAILED
    sys.stdout.write(answer.get("stdout", ""))
    sys.stderr.write(answer.get("stderr", ""))
    return code


if __name__ == "__main__":
    sys.exit(main())
