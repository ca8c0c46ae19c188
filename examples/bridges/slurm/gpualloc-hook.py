#!/usr/bin/python3 -IS
"""The Slurm scripts' client of `gpualloc-slurm sync --socket` (services/bridges/slurm/hooks.py).

    gpualloc-hook.py prolog | task-prolog | epilog --all-nodes --sweep   (as gpualloc-slurm)

Hands its arguments and the job's SLURM_* environment to the service on the Unix socket
GPUALLOC_SLURM_SOCKET (default /run/gpualloc-slurm.sock), then prints the answer and exits
with its status: the service does the work, so a hook costs a `python3 -I -S` start that
imports only built-in modules (milliseconds), not a start of gpualloc's Python. When nothing
listens on the socket (the service restarts), it runs GPUALLOC_SLURM_CLI (default
/opt/gpualloc/bin/gpualloc-slurm) with the same arguments instead: the same work, slower.
Built-in modules only, on purpose (json, socket would double its start): copy it next to the
scripts (/etc/slurm/gpualloc/).
"""

import _socket
import os
import sys

SOCKET = "/run/gpualloc-slurm.sock"
CLI = "/opt/gpualloc/bin/gpualloc-slurm"
MAGIC = b"gpualloc-hook 1\n"
EXIT_FAILED = 3
TIMEOUT_SECONDS = 300.0  # the service bounds its own calls; this bounds a service that hangs


def request(argv: list[str]) -> bytes:
    env = [
        f"{k}={v}" for k, v in os.environ.items() if k.startswith("SLURM") or k == "GPUALLOC_NVLINK"
    ]
    return MAGIC + "".join(f"{field}\0" for field in [*argv, "", *env]).encode()


def main() -> int:
    argv = sys.argv[1:]
    path = os.environ.get("GPUALLOC_SLURM_SOCKET") or SOCKET
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
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
        sock.sendall(request(argv))
        sock.shutdown(_socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        code, out, err = data.decode().split("\0", 2)
        status = int(code)
    except (OSError, ValueError) as error:
        print(f"gpualloc-hook: {path}: no answer: {error}", file=sys.stderr)
        return EXIT_FAILED
    sys.stdout.write(out)
    sys.stderr.write(err)
    return status


if __name__ == "__main__":
    sys.exit(main())
