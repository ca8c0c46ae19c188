#!/usr/bin/env sh
# A 3-primary + 3-replica Redis Cluster on loopback for trying gpualloc's cluster layout:
#
#   deploy/local/redis-cluster.sh start [DIR]   # prints the GPUALLOC_REDIS_URL to use
#   deploy/local/redis-cluster.sh stop [DIR]
#
# `make run-cluster` starts it, runs `gpualloc serve --demo` on it, and stops it afterwards.
# Ports GPUALLOC_CLUSTER_PORT (default 7000) .. +5, cluster bus ports .. +100. No persistence:
# data lives in DIR (default .run/redis-cluster) until `stop`. Needs redis-server and redis-cli.
set -eu

command="${1:-start}"
dir="${2:-.run/redis-cluster}"
base="${GPUALLOC_CLUSTER_PORT:-7000}"
ports="$base $((base + 1)) $((base + 2)) $((base + 3)) $((base + 4)) $((base + 5))"

url() {
  hosts=""
  for port in $ports; do hosts="${hosts:+$hosts,}127.0.0.1:$port"; done
  echo "redis+cluster://$hosts"
}

case "$command" in
start)
  mkdir -p "$dir"
  for port in $ports; do
    mkdir -p "$dir/$port"
    rm -f "$dir/$port/nodes.conf"
    redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes \
      --cluster-config-file nodes.conf --cluster-port "$((port + 100))" \
      --cluster-node-timeout 2000 --save "" --appendonly no --dir "$dir/$port" \
      --daemonize yes --pidfile "$dir/$port/redis.pid" --logfile "$dir/$port/redis.log"
  done
  for port in $ports; do
    tries=0
    until redis-cli -p "$port" ping >/dev/null 2>&1; do
      tries=$((tries + 1)); [ "$tries" -lt 100 ] || { echo "redis on $port did not start" >&2; exit 1; }
      sleep 0.1
    done
  done
  # shellcheck disable=SC2086
  redis-cli --cluster create $(for port in $ports; do printf '127.0.0.1:%s ' "$port"; done) \
    --cluster-replicas 1 --cluster-yes >"$dir/create.log"
  tries=0
  until redis-cli -p "$base" cluster info | grep -q 'cluster_state:ok'; do
    tries=$((tries + 1)); [ "$tries" -lt 200 ] || { echo "cluster not ok" >&2; exit 1; }
    sleep 0.1
  done
  url
  ;;
stop)
  for port in $ports; do
    if [ -f "$dir/$port/redis.pid" ]; then
      kill "$(cat "$dir/$port/redis.pid")" 2>/dev/null || true
      rm -f "$dir/$port/redis.pid"
    fi
  done
  ;;
url)
  url
  ;;
*)
  echo "usage: $0 start|stop|url [DIR]" >&2
  exit 2
  ;;
esac
