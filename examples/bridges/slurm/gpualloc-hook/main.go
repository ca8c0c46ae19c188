// gpualloc-hook: the Slurm hooks' client of `gpualloc-slurm sync --socket` (on the controller)
// or `gpualloc-slurm hooks --socket` (on a compute node), compiled; gpualloc-hook.py beside it
// is its portable twin (the same protocol, services/bridges/slurm/hooks.py).
//
// A multi-call binary. Slurm runs its PrologSlurmctld, TaskProlog, Epilog, EpilogSlurmctld and
// job completion script (jobcomp/script's JobCompLoc) itself, without a shell and with no
// argument but the path it was given, so each slurm.conf slot can name a symlink to this
// binary, and the link's name says which hook it is:
//
//	prolog-slurmctld  PrologSlurmctld  gpualloc-slurm prolog
//	taskprolog        TaskProlog       gpualloc-slurm task-prolog
//	epilog            Epilog (node)    gpualloc-slurm epilog --ignore-errors; exits 0, always
//	jobcomp           JobCompLoc       gpualloc-slurm epilog --all-nodes --sweep (JOBID, JOBNAME,
//	                                   NODES, CLUSTER as SLURM_JOB_ID, SLURM_JOB_NAME,
//	                                   SLURM_JOB_NODELIST, SLURM_CLUSTER_NAME)
//	epilog-slurmctld  EpilogSlurmctld  gpualloc-slurm epilog --all-nodes --sweep
//
// Under any other name (gpualloc-hook), its arguments are the command's, as the scripts of
// examples/bridges/slurm/*.sh pass them: gpualloc-hook prolog | task-prolog | epilog ...
//
// It sends the arguments and the job's SLURM_* environment to the service on the Unix socket
// GPUALLOC_SLURM_SOCKET (default /run/gpualloc-slurm.sock), prints the answer and exits with
// its status: the service does the work. When nothing listens there it runs GPUALLOC_SLURM_CLI
// (default /opt/gpualloc/bin/gpualloc-slurm) with the same arguments instead: the same work,
// at the cost of a Python start. Settings come from gpualloc-hook.conf in the directory the
// hook was run from (`NAME=value` lines, `#` comments; Slurm gives its hooks no environment of
// the site's, and a value there wins over the hook's environment, which a job's user may
// shape), else from the environment: the socket, the command, and what the command needs
// when it runs instead of the service (GPUALLOC_ALLOCATOR_ADDR, SLURM_CONF,
// GPUALLOC_SLURM_LEASE, TLS settings), which it passes on.
//
// gpualloc-slurm sync's holder jobs (gpualloc-held, root's) are let through at once. The node
// Epilog never fails (Slurm drains a node whose Epilog fails): whatever happens it exits 0,
// and a release it could not make is left to sync's sweep and the lease.
//
// Why a compiled client: Slurm waits on the PrologSlurmctld, the TaskProlog and the node
// Epilog of every job, and a `python3 -I -S` start costs 20-100 ms of that wait and of the
// host's CPU on a loaded machine, a shell a few more; this start costs about a millisecond
// (docs/bridges.md, "Hooks at Slurm's speed"). Go's standard library only (os, strconv, strings,
// syscall): no dependencies, a static binary.
package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

const (
	defaultSocket = "/run/gpualloc-slurm.sock"
	defaultCLI    = "/opt/gpualloc/bin/gpualloc-slurm"
	settingsFile  = "gpualloc-hook.conf"
	magic         = "gpualloc-hook 1\n"
	holderName    = "gpualloc-held"
	exitFailed    = 3
	timeoutSecs   = 300 // the service bounds its own calls; this bounds a service that hangs
	epilogSecs    = 30  // the node Epilog: Slurm keeps the node COMPLETING while it runs
)

// hook is what a slurm.conf slot's name stands for.
type hook struct {
	argv       []string
	jobcomp    bool // slurmctld's jobcomp/script variables, mapped to an epilog's
	neverFails bool // the node Epilog: exit 0 whatever happens
}

var hooks = map[string]hook{
	"prolog-slurmctld": {argv: []string{"prolog"}},
	"taskprolog":       {argv: []string{"task-prolog"}},
	"epilog":           {argv: []string{"epilog", "--ignore-errors"}, neverFails: true},
	"jobcomp":          {argv: []string{"epilog", "--all-nodes", "--sweep"}, jobcomp: true},
	"epilog-slurmctld": {argv: []string{"epilog", "--all-nodes", "--sweep"}},
}

// jobcompNames maps jobcomp/script's variables to the ones a Slurm epilog sets.
var jobcompNames = [][2]string{
	{"JOBID", "SLURM_JOB_ID"},
	{"JOBNAME", "SLURM_JOB_NAME"},
	{"NODES", "SLURM_JOB_NODELIST"},
	{"CLUSTER", "SLURM_CLUSTER_NAME"},
}

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

// loadSettings sets each NAME=value of the settings file in the environment.
func loadSettings(dir string) {
	data, err := os.ReadFile(dir + "/" + settingsFile)
	if err != nil {
		return // none: the environment and the defaults
	}
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		name, value, ok := strings.Cut(line, "=")
		if !ok || strings.HasPrefix(line, "#") || strings.TrimSpace(name) == "" {
			continue
		}
		os.Setenv(strings.TrimSpace(name), strings.TrimSpace(value))
	}
}

// holder says whether the job is one of gpualloc-slurm sync's holder jobs (nothing to do).
func holder(h hook) bool {
	if h.jobcomp {
		return os.Getenv("SLURM_JOB_NAME") == holderName && os.Getenv("USERNAME") == "root"
	}
	return os.Getenv("SLURM_JOB_NAME") == holderName && os.Getenv("SLURM_JOB_UID") == "0"
}

// runCLI runs the command in place of the service: exec'd, so it answers Slurm itself; for a
// hook that never fails, as a child whose failure is only reported.
func runCLI(argv []string, path string, neverFails bool) int {
	cli := env("GPUALLOC_SLURM_CLI", defaultCLI)
	args := append([]string{cli}, argv...)
	if !neverFails {
		err := syscall.Exec(cli, args, os.Environ())
		return fail(path + " does not answer and " + cli + ": " + err.Error())
	}
	pid, err := syscall.ForkExec(cli, args, &syscall.ProcAttr{
		Env:   os.Environ(),
		Files: []uintptr{0, 1, 2},
	})
	if err != nil {
		return fail(path + " does not answer and " + cli + ": " + err.Error())
	}
	var status syscall.WaitStatus
	for {
		_, err = syscall.Wait4(pid, &status, 0, nil)
		if err != syscall.EINTR {
			break
		}
	}
	switch {
	case err != nil:
		return fail(cli + ": " + err.Error())
	case status.Signaled():
		return fail(cli + " killed by " + status.Signal().String())
	case status.ExitStatus() != 0:
		return fail(cli + " exited " + strconv.Itoa(status.ExitStatus()))
	}
	return 0
}

func run(argv []string, timeout int64, neverFails bool) int {
	path := env("GPUALLOC_SLURM_SOCKET", defaultSocket)
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return fail("socket: " + err.Error())
	}
	if err := syscall.Connect(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		syscall.Close(fd)
		return runCLI(argv, path, neverFails)
	}
	defer syscall.Close(fd)
	limit := syscall.Timeval{Sec: timeout}
	for _, opt := range []int{syscall.SO_RCVTIMEO, syscall.SO_SNDTIMEO} {
		if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, opt, &limit); err != nil {
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
	invoked := os.Args[0]
	dir, name := ".", invoked
	if i := strings.LastIndexByte(invoked, '/'); i >= 0 {
		dir, name = invoked[:i], invoked[i+1:]
	}
	loadSettings(dir)
	h, named := hooks[name]
	if !named {
		os.Exit(run(os.Args[1:], timeoutSecs, false))
	}
	if h.jobcomp {
		for _, names := range jobcompNames {
			os.Setenv(names[1], os.Getenv(names[0]))
		}
	}
	if holder(h) {
		os.Exit(0)
	}
	timeout := int64(timeoutSecs)
	if h.neverFails {
		timeout = epilogSecs
	}
	code := run(h.argv, timeout, h.neverFails)
	if h.neverFails {
		code = 0
	}
	os.Exit(code)
}
