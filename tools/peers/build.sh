#!/usr/bin/env bash
# Builds the Go peers the tests run for real (kube-apiserver, etcd, Kueue's manager with its CRDs,
# ghz, grpcurl) from the small modules beside this script, the upstream-allocator benchmark
# (loadtest/upstream) and the Slurm scripts' compiled hook client (examples/bridges/slurm/
# gpualloc-hook: a client program, standard library only), into .peers/ at the repo root
# (ignored).
#
# Each module is built once per content: its binaries are kept under
#   ${GPUALLOC_PEERS_CACHE:-~/.cache/gpualloc/peers}/<module>-<hash of go.mod, go.sum, *.go, go version>/
# so a fresh clone on a machine that built them before only copies them; Go's own GOCACHE and
# GOMODCACHE make a rebuild after a change incremental. A peer that fails to build is reported with
# its module and error (the log stays in .peers/logs/) and the others are still built; the exit
# status is then 1.
#
# usage: tools/peers/build.sh [module ...]
#        (default: all: kube kueue ghz grpcurl upstream-allocator gpualloc-hook)
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$root/.peers"
cache="${GPUALLOC_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpualloc/peers}"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
# Only what the modules pin, whatever the caller's environment holds: a GOFLAGS set on this
# machine (-mod=mod, a vendor dir) would change what is built, and VCS stamping (-buildvcs auto)
# fails in a clone owned by another user (git's safe.directory), as CI checkouts often are.
export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false"
# GNU time reports each build's peak memory; a fresh machine may not have it (Debian: `time`).
timer=()
[ -x /usr/bin/time ] && timer=(/usr/bin/time -f "%e s wall, %M KiB max RSS")
[ -x "$GO" ] || { echo "peers: no Go toolchain (looked for go on PATH and /usr/local/go/bin/go)" >&2; exit 1; }
mkdir -p "$out/bin" "$out/logs" "$cache"

# module -> its directory (the peers' modules sit here; the upstream-allocator benchmark, a
# harness rather than a peer, in loadtest/upstream)
moddir() {
  case "$1" in
    upstream-allocator) echo "$root/loadtest/upstream" ;;
    gpualloc-hook) echo "$root/examples/bridges/slurm/gpualloc-hook" ;;
    *) echo "$here/$1" ;;
  esac
}

# module -> the packages it builds (binary name = last path element)
targets() {
  case "$1" in
    upstream-allocator | gpualloc-hook) echo "." ;;
    kube) echo "k8s.io/kubernetes/cmd/kube-apiserver ./cmd/etcd" ;;
    kueue) echo "sigs.k8s.io/kueue/cmd/kueue" ;;
    ghz) echo "github.com/bojand/ghz/cmd/ghz" ;;
    grpcurl) echo "github.com/fullstorydev/grpcurl/cmd/grpcurl" ;;
    *) return 1 ;;
  esac
}

# kube-apiserver reports the version it was stamped with (Kueue and clients read /version)
ldflags() {
  local mod="$1" v
  [ "$mod" = kube ] || return 0
  v="$(cd "$here/kube" && "$GO" list -m -f '{{.Version}}' k8s.io/kubernetes)"
  local minor="${v#v1.}"; minor="${minor%%.*}"
  local pkg=k8s.io/component-base/version
  echo "-X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
}

content_hash() {
  (cd "$(moddir "$1")" && { "$GO" version; find . -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) \
     | LC_ALL=C sort | xargs sha256sum; } | sha256sum | cut -c1-16)
}

build_module() {
  local mod="$1" key dir log pkgs start
  pkgs="$(targets "$mod")" || { echo "peers: unknown module $mod" >&2; return 1; }
  key="$mod-$(content_hash "$mod")"
  dir="$cache/$key"
  log="$out/logs/$mod.log"
  if [ ! -f "$dir/.complete" ]; then
    echo "peers: building $mod ($pkgs) into $dir"
    rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
    start=$(date +%s)
    if ! (cd "$(moddir "$mod")" && nice "${timer[@]}" \
          "$GO" build -trimpath -ldflags "$(ldflags "$mod")" -o "$dir.tmp/" $pkgs) >"$log" 2>&1; then
      echo "peers: FAILED to build module tools/peers/$mod ($pkgs); the error:" >&2
      tail -n 20 "$log" >&2
      rm -rf "$dir.tmp"
      return 1
    fi
    if [ "$mod" = kueue ]; then
      local src; src="$(cd "$here/kueue" && "$GO" list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
      mkdir -p "$dir.tmp/kueue-crds" && cp "$src"/config/components/crd/bases/*.yaml "$dir.tmp/kueue-crds/"
      chmod -R u+w "$dir.tmp/kueue-crds"
    fi
    echo "peers: built $mod in $(( $(date +%s) - start )) s ($(tail -n 1 "$log"))"
    rm -rf "$dir" && mv "$dir.tmp" "$dir" && touch "$dir/.complete"
  fi
  local f
  for f in "$dir"/*; do
    if [ -d "$f" ]; then rm -rf "$out/$(basename "$f")" && cp -r "$f" "$out/"
    else cp -f "$f" "$out/bin/"; fi
  done
  echo "$key" > "$out/$mod.key"
}

status=0
for mod in "${@:-ghz grpcurl kube kueue upstream-allocator gpualloc-hook}"; do
  for m in $mod; do build_module "$m" || status=1; done
done
exit $status
