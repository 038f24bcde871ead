#!/usr/bin/env bash
# Runs `wdp run` with the given config over this machine's real /sys and /dev, with the plugin
# directory in a temp dir and `wdp kubelet` standing in for kubelet. Stops on Ctrl-C, or after
# $DEMO_DURATION (e.g. 20s) when set.
set -euo pipefail
wdp=$1
config=$2
dir=$(mktemp -d -t wdp-demo.XXXXXX)
trap 'kill -TERM "${run_pid:-}" "${kubelet_pid:-}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT

echo "== wdp demo: plugin dir $dir/plugins; Ctrl-C to stop =="
duration=()
if [[ -n "${DEMO_DURATION:-}" ]]; then duration=(--duration "$DEMO_DURATION"); fi
"$wdp" kubelet --plugin-dir "$dir/plugins" --allocate "${duration[@]}" &
kubelet_pid=$!
# The stand-in cleans the directory first; start the host once kubelet.sock exists.
for _ in $(seq 100); do [[ -S "$dir/plugins/kubelet.sock" ]] && break; sleep 0.05; done
RUST_LOG=${RUST_LOG:-info} "$wdp" run --config "$config" --plugin-dir "$dir/plugins" &
run_pid=$!
wait "$kubelet_pid" || true
kill -TERM "$run_pid" 2>/dev/null || true
wait "$run_pid" || true
echo "== demo stopped; sockets left in the plugin dir: $(find "$dir/plugins" -type s | wc -l) (kubelet.sock is the stand-in's) =="
