#!/usr/bin/env bash
# Runs `wdp run` with the given config over this machine's real /sys and /dev, with the plugin
# directory in a temp dir and `wdp kubelet` standing in for kubelet. Once every scanner's first
# tree is served it prints what is served (`wdp status`), then runs until Ctrl-C, or for
# $DEMO_DURATION more (e.g. 20s, as `sleep` reads it) when set.
#
# It stops wdp first and the stand-in after, as a node stops a plugin while kubelet keeps
# running: wdp removes its sockets and ends its streams, and a clean run ends without warnings.
# Both run in sessions of their own, so Ctrl-C reaches only this script, which stops them in that
# order.
set -euo pipefail
wdp=$1
config=$2
dir=$(mktemp -d -t wdp-demo.XXXXXX)
run_pid=
kubelet_pid=
sleep_pid=

stop_wdp() {
    if [[ -n $run_pid ]]; then
        kill -TERM "$run_pid" 2>/dev/null || true
        wait "$run_pid" 2>/dev/null || true
        run_pid=
    fi
}
cleanup() {
    trap - INT TERM
    [[ -z $sleep_pid ]] || kill "$sleep_pid" 2>/dev/null || true
    stop_wdp
    if [[ -n $kubelet_pid ]]; then
        # The stand-in stops on SIGINT, as `wdp kubelet` run by hand does on Ctrl-C.
        kill -INT "$kubelet_pid" 2>/dev/null || true
        wait "$kubelet_pid" 2>/dev/null || true
        kubelet_pid=
    fi
    rm -rf "$dir"
}
trap cleanup EXIT
# Ctrl-C (or SIGTERM) ends the wait below; the script then stops both as at the end of a run.
interrupted=
trap 'interrupted=1' INT TERM

echo "== wdp demo: plugin dir $dir/plugins; Ctrl-C to stop =="
setsid "$wdp" kubelet --plugin-dir "$dir/plugins" --allocate &
kubelet_pid=$!
# The stand-in cleans the directory first; start the host once kubelet.sock exists.
for _ in $(seq 200); do [[ -S "$dir/plugins/kubelet.sock" ]] && break; sleep 0.05; done
[[ -S "$dir/plugins/kubelet.sock" ]] || { echo "demo: the kubelet stand-in did not start" >&2; exit 1; }

# /status on a port the kernel picks; the address is read back from wdp's log.
: >"$dir/wdp.log"
RUST_LOG=${RUST_LOG:-info} setsid "$wdp" run --config "$config" --plugin-dir "$dir/plugins" \
    --metrics-addr 127.0.0.1:0 2> >(tee "$dir/wdp.log" >&2) &
run_pid=$!

# Wait until wdp is ready (every scanner's first tree accepted and registered), then say what it
# serves. The first start compiles the scanners; a later one loads them from the compile cache.
addr=
status=
for _ in $(seq 1200); do
    [[ -z $interrupted ]] || break
    kill -0 "$run_pid" 2>/dev/null || { wait "$run_pid" || true; run_pid=; echo "demo: wdp run stopped (its log is above)" >&2; exit 1; }
    [[ -n $addr ]] || addr=$(sed -n 's/.*serving \/metrics.* addr=\([0-9.]*:[0-9]*\).*/\1/p' "$dir/wdp.log" | head -n 1)
    if [[ -n $addr ]] && status=$("$wdp" status --addr "$addr" 2>/dev/null) && [[ $status == *": ready"* ]]; then
        break
    fi
    sleep 0.1
done
echo
echo "== what wdp serves (wdp status --addr $addr) =="
echo "${status:-wdp did not answer /status}"
serving="until Ctrl-C"
[[ -z ${DEMO_DURATION:-} ]] || serving="for $DEMO_DURATION more"
echo "== above, the stand-in's lines: each resource registered, its devices, one allocated; serving" \
    "$serving =="
echo

if [[ -z $interrupted && -n ${DEMO_DURATION:-} ]]; then
    sleep "$DEMO_DURATION" &
    sleep_pid=$!
    wait -n "$sleep_pid" "$run_pid" "$kubelet_pid" || true
elif [[ -z $interrupted ]]; then
    wait -n "$run_pid" "$kubelet_pid" || true
fi
kill -0 "$run_pid" 2>/dev/null || echo "demo: wdp run stopped by itself (its log is above)" >&2
stop_wdp
left=$(find "$dir/plugins" -type s ! -name kubelet.sock | wc -l)
cleanup
trap - EXIT
echo "== demo stopped: wdp first (sockets it left in the plugin dir: $left), then the stand-in =="
