// gpualloc-hook: the Slurm scripts' client of `gpualloc-slurm sync --socket` (or, on a compute
// node, `gpualloc-slurm hooks --socket`), the compiled twin of gpualloc-hook.py beside it.
//
//	gpualloc-hook prolog | task-prolog | epilog --all-nodes --sweep   (as gpualloc-slurm)
//
// It sends its arguments and the job's SLURM_* environment to the service on the Unix socket
// GPUALLOC_SLURM_SOCKET (default /run/gpualloc-slurm.sock), prints the answer and exits with
// its status: the service does the work (services/bridges/slurm/hooks.py has the protocol).
// When nothing listens there it runs GPUALLOC_SLURM_CLI (default
// /opt/gpualloc/bin/gpualloc-slurm) with the same arguments instead: the same work, slower.
//
// Why a compiled client: Slurm waits on the PrologSlurmctld and the TaskProlog of every job,
// and a `python3 -I -S` start costs 20-100 ms of that wait and of the host's CPU on a loaded
// machine; this start costs about a millisecond (docs/bridges.md, "Hooks at Slurm's speed").
// The standard library's syscall package only: no dependencies, a static binary.
package main

import (
	"os"
	"strings"
	"syscall"
)

const (
	defaultSocket = "/run/gpualloc-slurm.sock"
	defaultCLI    = "/opt/gpualloc/bin/gpualloc-slurm"
	magic         = "gpualloc-hook 1\n"
	exitFailed    = 3
	timeoutSecs   = 300 // the service bounds its own calls; this bounds a service that hangs
)

func request(argv []string) []byte {
	var b strings.Builder
	b.WriteString(magic)
	for _, field := range argv {
		b.WriteString(field)
		b.WriteByte(0)
	}
	b.WriteByte(0) // the empty field between the arguments and the environment
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "SLURM") || strings.HasPrefix(kv, "GPUALLOC_NVLINK=") {
			b.WriteString(kv)
			b.WriteByte(0)
		}
	}
	return []byte(b.String())
}

func fail(text string) int {
	os.Stderr.WriteString("gpualloc-hook: " + text + "\n")
	return exitFailed
}

func env(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

func run(argv []string) int {
	path := env("GPUALLOC_SLURM_SOCKET", defaultSocket)
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return fail("socket: " + err.Error())
	}
	if err := syscall.Connect(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		syscall.Close(fd)
		cli := env("GPUALLOC_SLURM_CLI", defaultCLI)
		err := syscall.Exec(cli, append([]string{cli}, argv...), os.Environ())
		return fail(path + " does not answer and " + cli + ": " + err.Error())
	}
	defer syscall.Close(fd)
	timeout := syscall.Timeval{Sec: timeoutSecs}
	for _, opt := range []int{syscall.SO_RCVTIMEO, syscall.SO_SNDTIMEO} {
		if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, opt, &timeout); err != nil {
			return fail(path + ": " + err.Error())
		}
	}
	for data := request(argv); len(data) > 0; {
		n, err := syscall.Write(fd, data)
		if err != nil {
			return fail(path + ": no answer: " + err.Error())
		}
		data = data[n:]
	}
	if err := syscall.Shutdown(fd, syscall.SHUT_WR); err != nil {
		return fail(path + ": no answer: " + err.Error())
	}
	var answer []byte
	chunk := make([]byte, 65536)
	for {
		n, err := syscall.Read(fd, chunk)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return fail(path + ": no answer: " + err.Error())
		}
		if n == 0 {
			break
		}
		answer = append(answer, chunk[:n]...)
	}
	parts := strings.SplitN(string(answer), "\x00", 3)
	if len(parts) != 3 {
		return fail(path + ": no answer: not `code NUL stdout NUL stderr`")
	}
	code := 0
	for _, c := range parts[0] {
		if c < '0' || c > '9' || code > 255 {
			return fail(path + ": no answer: bad status " + parts[0])
		}
		code = code*10 + int(c-'0')
	}
	if parts[0] == "" {
		return fail(path + ": no answer: empty status")
	}
	os.Stdout.WriteString(parts[1])
	os.Stderr.WriteString(parts[2])
	return code
}

func main() {
	os.Exit(run(os.Args[1:]))
}
