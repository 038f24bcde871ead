#!/bin/bash
# The real-cluster e2e suite (`make e2e KUBE_BIN_DIR=...`): wdp's image and deploy/ in a
# single-node Kubernetes cluster made of the binaries in $KUBE_BIN_DIR (kubelet, kube-apiserver,
# kube-scheduler, kube-controller-manager, kubectl), Debian's etcd and containerd with runc.
#
# Everything runs on this machine: etcd and the control plane on 127.0.0.1, kubelet with a
# kubeconfig and client certificates made here with openssl, containerd with a root and socket
# of its own. No CNI network and no kube-proxy: every pod uses the host's network (the DaemonSet
# is patched to hostNetwork: true, and in DRA mode told the API server's address, which a pod
# would otherwise reach through the `kubernetes` Service). No registry: wdp's image (built by
# scripts/image.sh from target/debug/wdp), the pause image and the test pods' image (a static
# program, tests/e2e/probe.c) are imported into containerd.
#
# Two clusters in turn, each on a fresh node:
#   device-plugin mode  deploy/ as shipped: the Node's resources, a Pod given /dev/kvm by the
#                       scheduler and kubelet, kubelet restarted (SIGTERM) and killed (SIGKILL),
#                       the DaemonSet rolled to a new image tag; `wdp status` and metrics
#   DRA mode            deploy/ with deploy/dra/ and the kvm scanner on `frontend: dra`: kubelet
#                       registers the driver, slices, a ResourceClaim allocated and prepared,
#                       the CDI names kubelet keeps for the runtime resolved in wdp's specs,
#                       unprepare, kubelet's wipe and wdp's republish, the extended-resource
#                       bridge; `wdp status` and metrics
# Each check prints PASS or FAIL with what it saw; the last line is "N passed, N failed". The
# exit status is 1 when a check failed.
#
# Environment:
#   KUBE_BIN_DIR   the Kubernetes binaries (without it: a SKIP message and exit 0)
#   WDP_BINARY     the wdp binary to ship (default target/debug/wdp)
#   E2E_KEEP=1     keep the temp dir (logs, certificates) after the run
#   E2E_ONLY=dp|dra  one mode only
#
# Runs as root: kubelet, containerd, /var/lib/kubelet (the DaemonSet's hostPaths) and
# /var/run/cdi. What it changes on the machine is undone on exit: processes stopped, mounts
# under /var/lib/kubelet and the temp dir unmounted, /var/lib/kubelet and the CDI specs removed
# when they were not there before, kubelet's cgroups removed, and the sysctls kubelet sets
# (vm.overcommit_memory, kernel.panic, kernel.panic_on_oops) restored.
set -u

root=$(cd "$(dirname "$0")/../.." && pwd)
KUBE_BIN_DIR=${KUBE_BIN_DIR:-}
WDP_BINARY=${WDP_BINARY:-$root/target/debug/wdp}
E2E_ONLY=${E2E_ONLY:-}
kube_bins="kubelet kube-apiserver kube-scheduler kube-controller-manager kubectl"

if [ -z "$KUBE_BIN_DIR" ]; then
    cat <<EOF
e2e: SKIP: KUBE_BIN_DIR is not set. The real-cluster suite needs a directory holding the
Kubernetes binaries $kube_bins
(1.34 or later, built or downloaded by you), and runs as root on a machine where it may run
kubelet (Debian's etcd-server, containerd and runc are installed if missing). Run:
  make e2e KUBE_BIN_DIR=/path/to/bin
EOF
    exit 0
fi

die() { echo "e2e: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "runs as root (kubelet, containerd, /var/lib/kubelet)"
for b in $kube_bins; do
    [ -x "$KUBE_BIN_DIR/$b" ] || die "$KUBE_BIN_DIR/$b is missing or not executable"
done
[ -x "$WDP_BINARY" ] || die "$WDP_BINARY is missing (make wdp builds it)"

# Debian's etcd, containerd, runc and CNI plugins (the loopback plugin only: see containerd's
# config below), openssl for the certificates, a static C compiler for the probe.
missing=
command -v etcd >/dev/null || missing="$missing etcd-server"
command -v containerd >/dev/null || missing="$missing containerd"
command -v runc >/dev/null || missing="$missing runc"
[ -x /usr/lib/cni/loopback ] || missing="$missing containernetworking-plugins"
command -v openssl >/dev/null || missing="$missing openssl"
command -v curl >/dev/null || missing="$missing curl"
command -v podman >/dev/null || missing="$missing podman"
command -v python3 >/dev/null || missing="$missing python3"
python3 -c 'import yaml' 2>/dev/null || missing="$missing python3-yaml"
echo 'int main(void){return 0;}' | cc -static -x c -o /dev/null - 2>/dev/null || missing="$missing gcc libc6-dev"
if [ -n "$missing" ]; then
    echo "e2e: installing$missing"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null; } ||
        die "cannot install$missing"
fi

kubectl_bin=$KUBE_BIN_DIR/kubectl
T=$(mktemp -d /tmp/wdp-e2e.XXXXXX)
echo "e2e: working in $T"
passed=0
failed=0
pids=()
kubelet_pid=

# ---------------------------------------------------------------------------------------------
# Results

check() { # check NAME ok|fail WHAT-IT-SAW
    if [ "$2" = ok ]; then
        passed=$((passed + 1))
        echo "PASS $1: $3"
    else
        failed=$((failed + 1))
        echo "FAIL $1: $3"
    fi
}

note() { echo "     $*"; }

# poll SECONDS COMMAND...: runs COMMAND every half second until it succeeds; 1 on timeout.
poll() {
    local deadline=$(($(date +%s) + $1))
    shift
    until "$@" 2>/dev/null; do
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        sleep 0.5
    done
}

k() { "$kubectl_bin" --kubeconfig "$T/admin.kubeconfig" "$@"; }

# ---------------------------------------------------------------------------------------------
# The machine's state, restored on exit

sysctls="vm.overcommit_memory kernel.panic kernel.panic_on_oops"
for s in $sysctls; do
    echo "$s=$(sysctl -n "$s")" >>"$T/sysctls.saved"
done
kubelet_dir_existed=no
[ -e /var/lib/kubelet ] && kubelet_dir_existed=yes
cdi_dir_existed=no
[ -d /var/run/cdi ] && cdi_dir_existed=yes
ls /var/run/cdi 2>/dev/null | sort >"$T/cdi.before"

unmount_under() { # every mount point below $1, deepest first
    findmnt -rn -o TARGET | awk -v p="$1" 'index($0, p) == 1' | sort -r | while read -r m; do
        umount -l "$m" 2>/dev/null
    done
}

stop_pid() { # stop_pid PID: SIGTERM, then SIGKILL after 10 s
    local pid=$1 i
    kill -0 "$pid" 2>/dev/null || return 0
    kill "$pid" 2>/dev/null
    for i in $(seq 1 40); do
        kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null; return 0; }
        sleep 0.25
    done
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
}

# The cluster's processes, newest first; containerd's shims (started by containerd, reparented)
# are found by the socket address of this run's containerd, which only they carry.
cluster_down() {
    local i pid id
    # Every container killed first (kubelet leaves its pods running when it stops; a shim killed
    # would leave its container's processes behind).
    if [ -S "$T/containerd/containerd.sock" ]; then
        [ -n "$kubelet_pid" ] && stop_pid "$kubelet_pid"
        kubelet_pid=
        for id in $(ctr -a "$T/containerd/containerd.sock" -n k8s.io tasks ls -q 2>/dev/null); do
            ctr -a "$T/containerd/containerd.sock" -n k8s.io tasks kill -a -s SIGKILL "$id" >/dev/null 2>&1
        done
        poll 20 sh -c "! ctr -a '$T/containerd/containerd.sock' -n k8s.io tasks ls | grep -q RUNNING"
    fi
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
        [ "${pids[$i]}" = kubelet ] && pid=$kubelet_pid || pid=${pids[$i]}
        [ -n "$pid" ] && stop_pid "$pid"
    done
    pids=()
    kubelet_pid=
    for pid in $(pgrep -f "containerd-shim.*$T/" 2>/dev/null); do
        kill -9 "$pid" 2>/dev/null
    done
    unmount_under /var/lib/kubelet
    unmount_under "$T/"
    # kubelet's cgroups (cgroupfs driver: kubepods/... in every v1 hierarchy, or the v2 tree).
    for d in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
        [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
    done
    [ "$kubelet_dir_existed" = no ] && rm -rf /var/lib/kubelet
    # The CDI specs this run's pods left (the next cluster's node never ran them).
    if [ "$cdi_dir_existed" = no ]; then
        rm -rf /var/run/cdi
    else
        ls /var/run/cdi 2>/dev/null | sort | comm -13 "$T/cdi.before" - | while read -r f; do
            rm -f "/var/run/cdi/$f"
        done
    fi
}

restore() {
    trap - EXIT INT TERM
    echo "e2e: tearing down"
    cluster_down
    while IFS='=' read -r s v; do
        sysctl -qw "$s=$v" >/dev/null
    done <"$T/sysctls.saved"
    if [ "${E2E_KEEP:-}" = 1 ] || [ "$failed" != 0 ]; then
        rm -rf "$T/containerd" "$T/images.tar" "$T/probe-image"
        echo "e2e: logs kept in $T"
    else
        rm -rf "$T"
    fi
}
trap restore EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------------------------
# Certificates, keys, kubeconfigs

host_ip=$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')
[ -n "$host_ip" ] || host_ip=$(hostname -I | awk '{print $1}')
[ -n "$host_ip" ] || die "no non-loopback IPv4 address (kubelet refuses a loopback node IP)"

pki=$T/pki
mkdir -p "$pki"
cert() { # cert NAME SUBJECT EXTENSIONS
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$pki/$1.key" \
        -subj "$2" -out "$pki/$1.csr" 2>/dev/null &&
        printf '%s\n' "$3" >"$pki/$1.ext" &&
        openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
            -days 2 -out "$pki/$1.crt" -extfile "$pki/$1.ext" 2>/dev/null
}
client_ext='keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth'
make_pki() {
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
        -keyout "$pki/ca.key" -out "$pki/ca.crt" -subj /CN=wdp-e2e-ca 2>/dev/null || return 1
    cert apiserver /CN=kube-apiserver "keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.0.0.1,IP:$host_ip,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local" || return 1
    cert admin /O=system:masters/CN=admin "$client_ext" || return 1
    cert apiserver-kubelet /O=system:masters/CN=kube-apiserver-kubelet-client "$client_ext" || return 1
    cert scheduler /CN=system:kube-scheduler "$client_ext" || return 1
    cert controller-manager /CN=system:kube-controller-manager "$client_ext" || return 1
    for node in e2e-dp e2e-dra; do
        cert "kubelet-$node" "/O=system:nodes/CN=system:node:$node" "$client_ext" || return 1
    done
    openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null &&
        openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
}
kubeconfig() { # kubeconfig FILE CERT-NAME
    local f=$1
    "$kubectl_bin" --kubeconfig "$f" config set-cluster e2e --server=https://127.0.0.1:6443 \
        --certificate-authority="$pki/ca.crt" --embed-certs >/dev/null &&
        "$kubectl_bin" --kubeconfig "$f" config set-credentials u --client-certificate="$pki/$2.crt" \
            --client-key="$pki/$2.key" --embed-certs >/dev/null &&
        "$kubectl_bin" --kubeconfig "$f" config set-context e2e --cluster=e2e --user=u >/dev/null &&
        "$kubectl_bin" --kubeconfig "$f" config use-context e2e >/dev/null
}
make_pki || die "openssl could not make the certificates"
kubeconfig "$T/admin.kubeconfig" admin
kubeconfig "$T/scheduler.kubeconfig" scheduler
kubeconfig "$T/controller-manager.kubeconfig" controller-manager
kubeconfig "$T/kubelet-e2e-dp.kubeconfig" kubelet-e2e-dp
kubeconfig "$T/kubelet-e2e-dra.kubeconfig" kubelet-e2e-dra

# DRA's extended-resource bridge and kubelet's device health are alpha in 1.34.
gates=DRAExtendedResource=true,ResourceHealthStatus=true

# ---------------------------------------------------------------------------------------------
# Images: wdp's (scripts/image.sh), and one static program as the pause image and the test pods'

pause_image=localhost/wdp-e2e/pause:1
probe_image=localhost/wdp-e2e/probe:1
build_images() {
    local ctx=$T/probe-image
    mkdir -p "$ctx"
    cc -static -O2 -o "$ctx/probe" "$root/tests/e2e/probe.c" || return 1
    printf 'FROM scratch\nCOPY probe /probe\nENTRYPOINT ["/probe", "--sleep"]\n' >"$ctx/Containerfile"
    podman build -q --isolation chroot -f "$ctx/Containerfile" -t "$pause_image" -t "$probe_image" "$ctx" >/dev/null || return 1
    "$root/scripts/image.sh" --binary "$WDP_BINARY" --tag localhost/wdp:e2e-1 >"$T/image.log" 2>&1 || {
        cat "$T/image.log"
        return 1
    }
    podman tag localhost/wdp:e2e-1 localhost/wdp:e2e-2
    podman save -o "$T/images.tar" --multi-image-archive "$pause_image" "$probe_image" \
        localhost/wdp:e2e-1 localhost/wdp:e2e-2 >/dev/null 2>&1
}
echo "e2e: building the images"
build_images || die "cannot build the images"

# ---------------------------------------------------------------------------------------------
# The cluster

start() { # start NAME COMMAND...: in the background, logging to $T/NAME.log
    local name=$1
    shift
    "$@" >>"$T/$name.log" 2>&1 &
    pids+=("$!")
}

start_kubelet() {
    "$KUBE_BIN_DIR/kubelet" --config "$T/kubelet.yaml" --kubeconfig "$T/kubelet-$node.kubeconfig" \
        --hostname-override "$node" --node-ip "$host_ip" --v=2 >>"$T/kubelet.log" 2>&1 &
    kubelet_pid=$!
}

node_ready() {
    [ "$(k get node "$node" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]
}

cluster_up() { # cluster_up NODE
    node=$1
    rm -rf "$T/etcd" "$T/containerd" "$T/cni"
    mkdir -p "$T/containerd" "$T/cni" /var/lib/kubelet
    echo "==== cluster $node: $(date -u +%FT%TZ)" | tee -a "$T"/{etcd,apiserver,kcm,scheduler,containerd,kubelet}.log >/dev/null
    start etcd etcd --name e2e --data-dir "$T/etcd" \
        --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
        --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
        --initial-cluster e2e=http://127.0.0.1:2380
    start apiserver "$KUBE_BIN_DIR/kube-apiserver" --bind-address=127.0.0.1 --secure-port=6443 \
        --advertise-address="$host_ip" --etcd-servers=http://127.0.0.1:2379 \
        --client-ca-file="$pki/ca.crt" --tls-cert-file="$pki/apiserver.crt" \
        --tls-private-key-file="$pki/apiserver.key" \
        --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
        --service-account-issuer=https://kubernetes.default.svc.cluster.local \
        --service-cluster-ip-range=10.0.0.0/24 --authorization-mode=Node,RBAC \
        --enable-admission-plugins=NodeRestriction \
        --kubelet-client-certificate="$pki/apiserver-kubelet.crt" \
        --kubelet-client-key="$pki/apiserver-kubelet.key" \
        --kubelet-preferred-address-types=InternalIP --feature-gates="$gates"
    # containerd 1.6 without CAP_SYS_RESOURCE may not lower a process's oom_score_adj:
    # restrict_oom_score_adj keeps it at what containerd has. A loopback-only CNI network makes
    # the runtime's network "ready" (kubelet keeps a node without one NotReady); every pod uses
    # the host's network anyway.
    printf '{"cniVersion": "0.4.0", "name": "e2e-lo", "plugins": [{"type": "loopback"}]}\n' >"$T/cni/10-lo.conflist"
    cat >"$T/containerd/config.toml" <<EOF
version = 2
root = "$T/containerd/root"
state = "$T/containerd/state"
[grpc]
  address = "$T/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_image"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$T/cni"
EOF
    start containerd containerd --config "$T/containerd/config.toml"
    poll 60 test -S "$T/containerd/containerd.sock" || return 1
    ctr -a "$T/containerd/containerd.sock" -n k8s.io images import "$T/images.tar" >>"$T/containerd.log" 2>&1 ||
        return 1
    poll 120 k get --raw /readyz >/dev/null || { echo "e2e: the API server never got ready"; return 1; }
    start kcm "$KUBE_BIN_DIR/kube-controller-manager" --kubeconfig="$T/controller-manager.kubeconfig" \
        --authentication-kubeconfig="$T/controller-manager.kubeconfig" \
        --authorization-kubeconfig="$T/controller-manager.kubeconfig" \
        --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
        --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
        --use-service-account-credentials --leader-elect=false --bind-address=127.0.0.1 \
        --feature-gates="$gates"
    start scheduler "$KUBE_BIN_DIR/kube-scheduler" --kubeconfig="$T/scheduler.kubeconfig" \
        --authentication-kubeconfig="$T/scheduler.kubeconfig" \
        --authorization-kubeconfig="$T/scheduler.kubeconfig" \
        --leader-elect=false --bind-address=127.0.0.1 --feature-gates="$gates"
    cat >"$T/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: { enabled: false }
  webhook: { enabled: true }
  x509: { clientCAFile: "$pki/ca.crt" }
authorization: { mode: Webhook }
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$T/containerd/containerd.sock
failSwapOn: false
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
resolvConf: /etc/resolv.conf
# A development machine's disk and memory must not evict the test's pods or its images.
evictionHard: { memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%" }
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
featureGates: { DRAExtendedResource: true, ResourceHealthStatus: true }
EOF
    pids+=(kubelet)
    start_kubelet
    poll 120 node_ready || { echo "e2e: node $node never got Ready"; return 1; }
    poll 60 k get serviceaccount default -n default >/dev/null || return 1
}

# A kustomization of deploy/ (and deploy/dra/ for DRA) as this cluster needs it: the image
# imported here, the host's network, and in DRA mode the API server's address and the kvm
# scanner on `frontend: dra`. kustomize takes relative paths only.
write_kustomization() { # write_kustomization dp|dra TAG
    local dir=$T/kust-$1 rel base_image
    mkdir -p "$dir"
    rel=$(realpath --relative-to="$dir" "$root/deploy")
    base_image=$("$kubectl_bin" kustomize "$root/deploy" | sed -n 's/^ *image: \(.*\):[^:]*$/\1/p' | head -n 1)
    {
        echo "apiVersion: kustomize.config.k8s.io/v1beta1"
        echo "kind: Kustomization"
        echo "resources: [$rel]"
        [ "$1" = dra ] && echo "components: [$rel/dra]"
        echo "images: [{name: $base_image, newName: localhost/wdp, newTag: $2}]"
        echo "patches:"
        echo "  - target: {kind: DaemonSet, name: wdp}"
        echo "    path: host-network.yaml"
        [ "$1" = dra ] && echo "  - path: config-dra.yaml"
    } >"$dir/kustomization.yaml"
    cat >"$dir/host-network.yaml" <<EOF
- op: replace
  path: /spec/template/spec/hostNetwork
  value: true
- op: add
  path: /spec/template/spec/containers/0/env/-
  value: { name: KUBERNETES_SERVICE_HOST, value: "127.0.0.1" }
- op: add
  path: /spec/template/spec/containers/0/env/-
  value: { name: KUBERNETES_SERVICE_PORT, value: "6443" }
EOF
    if [ "$1" = dra ]; then
        # The shipped ConfigMap with the kvm scanner moved to DRA (a line after its namespace).
        python3 - "$root/deploy/configmap.yaml" "$dir/config-dra.yaml" <<'EOF'
import sys, yaml
cm = yaml.safe_load(open(sys.argv[1]))
lines = cm["data"]["wdp.yaml"].split("\n")
i = lines.index("    namespace: devices.wdp.dev")
lines.insert(i + 1, "    frontend: dra")
cm["data"]["wdp.yaml"] = "\n".join(lines)
yaml.safe_dump(cm, open(sys.argv[2], "w"), sort_keys=False)
EOF
    fi
}

apply_deploy() { # apply_deploy dp|dra TAG
    write_kustomization "$1" "$2"
    k apply -k "$T/kust-$1" --validate=strict >"$T/apply.out" 2>&1
}

wdp_pod() {
    k -n wdp-system get pods -l app.kubernetes.io/name=wdp --field-selector=status.phase=Running \
        -o jsonpath='{.items[0].metadata.name}'
}

rollout_done() {
    k -n wdp-system rollout status daemonset/wdp --timeout=5s >/dev/null
}

# A test pod: /probe --sleep PATH, with hostNetwork and tolerating everything; extra spec lines
# (resources, claims) appended to the container or the pod.
pod_yaml() { # pod_yaml NAME PATH CONTAINER-EXTRA POD-EXTRA
    cat <<EOF
apiVersion: v1
kind: Pod
metadata: { name: $1, namespace: default }
spec:
  hostNetwork: true
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  tolerations: [{ operator: Exists }]
  containers:
    - name: probe
      image: $probe_image
      imagePullPolicy: Never
      command: [/probe, --sleep, $2]
$3
$4
EOF
}

pod_phase() { k get pod "$1" -o jsonpath='{.status.phase}'; }
pod_running() { [ "$(pod_phase "$1")" = Running ]; }
pod_log() { k logs "$1" 2>&1 | tr '\n' ' '; }
pod_restarts() { k get pod "$1" -o jsonpath='{.status.containerStatuses[0].restartCount}'; }
pod_container_id() { k get pod "$1" -o jsonpath='{.status.containerStatuses[0].containerID}'; }

# CDI names (vendor/class=device) resolved in the spec files of /var/run/cdi: prints each as
# "name -> file" or "name -> UNRESOLVED"; fails when one is not resolved.
resolve_cdi() {
    python3 - "$@" <<'EOF'
import glob, json, sys, yaml
specs = {}
for f in glob.glob("/var/run/cdi/*"):
    try:
        s = yaml.safe_load(open(f))
        for d in s.get("devices", []):
            specs[s["kind"] + "=" + d["name"]] = f
    except Exception as e:
        print(f"unreadable spec {f}: {e}")
ok = len(sys.argv) > 1
for name in sys.argv[1:]:
    print(f"{name} -> {specs.get(name, 'UNRESOLVED')}")
    ok = ok and name in specs
sys.exit(0 if ok else 1)
EOF
}

# The CDI names kubelet keeps for a pod's devices in device-plugin mode: the Allocate answers
# in its checkpoint (protobuf, base64), from which it builds the container's CDI devices.
dp_cdi_names() { # dp_cdi_names POD-UID
    python3 - "$1" <<'EOF'
import base64, json, re, sys
data = json.load(open("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"))["Data"]
names = set()
for e in data.get("PodDeviceEntries") or []:
    if e["PodUID"] == sys.argv[1]:
        raw = base64.b64decode(e["AllocResp"])
        names.update(m.decode() for m in re.findall(rb"[a-z0-9.-]+/[a-zA-Z0-9_.-]+=[a-zA-Z0-9_.:-]+", raw))
print(" ".join(sorted(names)))
EOF
}

# The CDI ids kubelet keeps for a claim in DRA mode (its dra_manager_state checkpoint), which it
# hands the runtime as the container's CDI devices.
dra_cdi_names() { # dra_cdi_names CLAIM-UID
    python3 - "$1" <<'EOF'
import json, sys
raw = open("/var/lib/kubelet/dra_manager_state").read()
names = set()
def walk(v, inside):
    if isinstance(v, dict):
        inside = inside or v.get("ClaimUID") == sys.argv[1] or v.get("claimUID") == sys.argv[1]
        for key, x in v.items():
            if key in ("CDIDeviceIDs", "cdiDeviceIDs") and inside and x:
                names.update(x)
            walk(x, inside)
    elif isinstance(v, list):
        for x in v:
            walk(x, inside)
doc = json.loads(raw)
if isinstance(doc.get("Data"), str):
    doc = json.loads(doc["Data"])
walk(doc, False)
print(" ".join(sorted(names)))
EOF
}

kubelet_restart() { # kubelet_restart TERM|KILL
    local old=$kubelet_pid
    kill -s "$1" "$old"
    wait "$old" 2>/dev/null
    echo "==== kubelet restart after SIG$1: $(date -u +%FT%TZ)" >>"$T/kubelet.log"
    start_kubelet
}

# ---------------------------------------------------------------------------------------------
# Device-plugin mode

allocatable() { k get node "$node" -o jsonpath="{.status.allocatable.devices\\.wdp\\.dev/$1}"; }
kvm_allocatable() { [ "$(allocatable kvm)" = 110 ]; }

dp_status_agree() { # `wdp status --json`, /metrics and the Node agree on the kvm resource
    local pod status
    pod=$(wdp_pod)
    status=$(k -n wdp-system exec "$pod" -- /usr/bin/wdp status --json 2>&1)
    seen="status: $(echo "$status" | python3 -c '
import json, sys
d = json.load(sys.stdin)
print("ready=%s" % d["ready"], " ".join("%s registered=%s healthy=%s" % (r["name"], r["registered"], r["healthy"]) for s in d["scanners"] for r in s["resources"]))' 2>&1);"
    seen="$seen metrics wdp_resource_devices{kvm,healthy}=$(curl -s http://127.0.0.1:9464/metrics | grep '^wdp_resource_devices{' | grep 'devices.wdp.dev/kvm' | grep healthy | grep -v unhealthy | awk '{print $2}');"
    seen="$seen node allocatable kvm=$(allocatable kvm)"
    echo "$status" | python3 -c '
import json, sys
d = json.load(sys.stdin)
r = [r for s in d["scanners"] for r in s["resources"] if r["name"] == "devices.wdp.dev/kvm"][0]
sys.exit(0 if d["ready"] and r["registered"] and r["healthy"] == 110 else 1)' 2>/dev/null &&
        curl -s http://127.0.0.1:9464/metrics | grep '^wdp_resource_devices{' | grep 'devices.wdp.dev/kvm' |
        grep '"healthy"' | awk '{print $2}' | grep -qx 110 && [ "$(allocatable kvm)" = 110 ]
}

stream_losses() {
    curl -s http://127.0.0.1:9464/metrics | grep '^wdp_resource_stream_losses_total{' | awk '{s += $2} END {print s + 0}'
}

run_dp() {
    echo "== device-plugin mode (node e2e-dp)"
    cluster_up e2e-dp || { check dp.cluster fail "the cluster did not come up (logs in $T)"; return; }
    check dp.cluster ok "node e2e-dp Ready, kubelet $(k get node e2e-dp -o jsonpath='{.status.nodeInfo.kubeletVersion}'), runtime $(k get node e2e-dp -o jsonpath='{.status.nodeInfo.containerRuntimeVersion}')"

    if apply_deploy dp e2e-1; then
        check dp.apply ok "kubectl apply -k --validate=strict: $(tr '\n' ';' <"$T/apply.out")"
    else
        check dp.apply fail "$(cat "$T/apply.out")"
        return
    fi
    if poll 120 rollout_done; then
        check dp.daemonset ok "rollout complete, pod $(wdp_pod) ready"
    else
        check dp.daemonset fail "not rolled out: $(k -n wdp-system get pods -o wide 2>&1 | tr '\n' ';') $(k -n wdp-system describe pods 2>&1 | tail -n 15 | tr '\n' ';')"
    fi

    if poll 60 kvm_allocatable; then
        check dp.node-resources ok "allocatable kvm=$(allocatable kvm) tun=$(allocatable tun) fuse=$(allocatable fuse) vhost-net=$(allocatable vhost-net)"
    else
        check dp.node-resources fail "allocatable: $(k get node "$node" -o jsonpath='{.status.allocatable}')"
    fi

    local limits="      resources: { limits: { devices.wdp.dev/kvm: 1 } }"
    pod_yaml dp-kvm /dev/kvm "$limits" "" | k apply -f - >/dev/null
    local saw
    if poll 90 pod_running dp-kvm && poll 20 sh -c "'$kubectl_bin' --kubeconfig '$T/admin.kubeconfig' logs dp-kvm | grep -q 'open /dev/kvm'"; then
        saw="scheduled by $(k get events --field-selector involvedObject.name=dp-kvm,reason=Scheduled -o jsonpath='{.items[0].reportingComponent}{.items[0].source.component}'): $(pod_log dp-kvm)"
        if pod_log dp-kvm | grep -q 'open /dev/kvm 0'; then check dp.pod-device ok "$saw"; else check dp.pod-device fail "$saw"; fi
    else
        check dp.pod-device fail "pod dp-kvm $(pod_phase dp-kvm): $(k describe pod dp-kvm | tail -n 8 | tr '\n' ';')"
    fi
    local uid cid
    uid=$(k get pod dp-kvm -o jsonpath='{.metadata.uid}')
    cid=$(pod_container_id dp-kvm)
    local names
    names=$(dp_cdi_names "$uid")
    if [ -n "$names" ] && saw=$(resolve_cdi $names); then
        check dp.cdi ok "kubelet's checkpoint holds $(echo "$saw" | tr '\n' ';')"
    else
        check dp.cdi fail "kubelet's checkpoint for pod $uid: '${names}' ${saw:-}"
    fi
    if dp_status_agree; then check dp.status-metrics ok "$seen"; else check dp.status-metrics fail "$seen"; fi

    local sig lsig pod
    for sig in TERM KILL; do
        local losses_before
        losses_before=$(stream_losses)
        kubelet_restart $sig
        lsig=$(echo "$sig" | tr A-Z a-z)
        pod=dp-after-$lsig
        if poll 90 node_ready && poll 60 kvm_allocatable; then
            pod_yaml "$pod" /dev/kvm "$limits" "" | k apply -f - >/dev/null
            if poll 90 pod_running "$pod" && poll 20 sh -c "'$kubectl_bin' --kubeconfig '$T/admin.kubeconfig' logs $pod | grep -q 'open /dev/kvm 0'"; then
                saw="after SIG$sig: allocatable kvm=$(allocatable kvm); new pod $pod: $(pod_log "$pod")"
                # The first pod's container ran on, with its device.
                local exec_out
                exec_out=$(k exec dp-kvm -- /probe /dev/kvm 2>&1 | tr '\n' ' ')
                saw="$saw; dp-kvm container $( [ "$(pod_container_id dp-kvm)" = "$cid" ] && echo same || echo CHANGED), restarts $(pod_restarts dp-kvm), exec: $exec_out"
                if [ "$(pod_container_id dp-kvm)" = "$cid" ] && echo "$exec_out" | grep -q 'open /dev/kvm 0'; then
                    check "dp.kubelet-sig$lsig" ok "$saw"
                else
                    check "dp.kubelet-sig$lsig" fail "$saw"
                fi
            else
                check "dp.kubelet-sig$lsig" fail "pod $pod $(pod_phase "$pod"): $(k describe pod "$pod" | tail -n 6 | tr '\n' ';')"
            fi
        else
            check "dp.kubelet-sig$lsig" fail "node Ready=$(node_ready && echo yes || echo no), allocatable kvm=$(allocatable kvm)"
        fi
        local losses_after
        losses_after=$(stream_losses)
        if [ "$losses_after" = "$losses_before" ]; then
            check "dp.kubelet-sig$lsig-no-stream-loss" ok "wdp_resource_stream_losses_total stayed $losses_after"
        else
            check "dp.kubelet-sig$lsig-no-stream-loss" fail "wdp_resource_stream_losses_total $losses_before -> $losses_after over a kubelet restart (SIG$sig)"
        fi
    done

    # The DaemonSet rolled to a new image tag: running pods keep their devices and CDI specs.
    local old_pod
    old_pod=$(wdp_pod)
    k -n wdp-system logs "$old_pod" >"$T/wdp-dp-before-rollout.log" 2>&1
    if apply_deploy dp e2e-2 && poll 120 sh -c "[ \"\$('$kubectl_bin' --kubeconfig '$T/admin.kubeconfig' -n wdp-system get pods -l app.kubernetes.io/name=wdp -o jsonpath='{.items[*].spec.containers[0].image}')\" = localhost/wdp:e2e-2 ]" && poll 120 rollout_done; then
        local exec_out new_names
        exec_out=$(k exec dp-kvm -- /probe /dev/kvm 2>&1 | tr '\n' ' ')
        new_names=$(resolve_cdi $names 2>&1)
        pod_yaml dp-after-rollout /dev/kvm "$limits" "" | k apply -f - >/dev/null
        poll 90 pod_running dp-after-rollout
        poll 20 sh -c "'$kubectl_bin' --kubeconfig '$T/admin.kubeconfig' logs dp-after-rollout | grep -q 'open /dev/kvm'"
        saw="wdp pod $old_pod -> $(wdp_pod) ($(k -n wdp-system get pod "$(wdp_pod)" -o jsonpath='{.spec.containers[0].image}')); dp-kvm container $( [ "$(pod_container_id dp-kvm)" = "$cid" ] && echo same || echo CHANGED), exec: $exec_out; CDI: $(echo "$new_names" | tr '\n' ';'); new pod: $(pod_log dp-after-rollout)"
        if [ "$(pod_container_id dp-kvm)" = "$cid" ] && echo "$exec_out" | grep -q 'open /dev/kvm 0' &&
            resolve_cdi $names >/dev/null && pod_log dp-after-rollout | grep -q 'open /dev/kvm 0'; then
            check dp.rollout ok "$saw"
        else
            check dp.rollout fail "$saw"
        fi
    else
        check dp.rollout fail "not rolled to e2e-2: $(k -n wdp-system get pods -o wide 2>&1 | tr '\n' ';')"
    fi
    if dp_status_agree; then check dp.status-metrics-after ok "$seen"; else check dp.status-metrics-after fail "$seen"; fi
    cp "$T/kubelet.log" "$T/kubelet-dp.log"
    k -n wdp-system logs --all-containers -l app.kubernetes.io/name=wdp --tail=-1 >"$T/wdp-dp.log" 2>&1
    k get events -A -o wide >"$T/events-dp.txt" 2>&1

    # Uninstall (docs/src/operator/upgrade.md): the sockets go with the pods, the CDI specs stay for running pods.
    k delete -k "$T/kust-dp" --wait=true --timeout=120s >/dev/null 2>&1
    local left specs
    left=$(find /var/lib/kubelet/device-plugins -mindepth 1 ! -name kubelet.sock ! -name kubelet_internal_checkpoint -printf '%f ')
    specs=$(ls /var/run/cdi | tr '\n' ' ')
    saw="left in device-plugins: '${left}'; CDI specs: $specs; dp-kvm exec: $(k exec dp-kvm -- /probe /dev/kvm 2>&1 | tr '\n' ' '); node capacity: $(k get node "$node" -o jsonpath='{.status.capacity}')"
    if [ -z "$left" ] && echo "$specs" | grep -q 'wdp-devices.wdp.dev-kvm'; then
        check dp.uninstall ok "$saw"
    else
        check dp.uninstall fail "$saw"
    fi
    cluster_down
}

# ---------------------------------------------------------------------------------------------
# DRA mode

# Since kubelet's last start (the log's last "====" line). At --v=2 kubelet 1.34 logs the
# connection to the driver's DRA socket, made once GetInfo and the registration succeeded.
kubelet_since_start() { tac "$T/kubelet.log" | sed '/^====/q' | tac; }
kubelet_registered_dra() {
    kubelet_since_start | grep -q 'Registered DRA plugin.*devices.wdp.dev\|Connection changed.*driverName="devices.wdp.dev".*connected=true'
}
slice_devices() { # the number of devices in the node's slices of devices.wdp.dev
    k get resourceslices --field-selector "spec.nodeName=$node,spec.driver=devices.wdp.dev" -o json |
        python3 -c 'import json, sys; print(sum(len(s["spec"].get("devices", [])) for s in json.load(sys.stdin)["items"]))'
}
slice_uids() {
    k get resourceslices --field-selector "spec.nodeName=$node,spec.driver=devices.wdp.dev" -o jsonpath='{.items[*].metadata.uid}'
}
slices_present() { [ "$(slice_devices)" -gt 0 ]; }

run_dra() {
    echo "== DRA mode (node e2e-dra, which never ran the device plugin)"
    cluster_up e2e-dra || { check dra.cluster fail "the cluster did not come up (logs in $T)"; return; }
    check dra.cluster ok "node e2e-dra Ready, kubelet $(k get node e2e-dra -o jsonpath='{.status.nodeInfo.kubeletVersion}')"
    if apply_deploy dra e2e-1; then
        check dra.apply ok "kubectl apply -k --validate=strict: $(tr '\n' ';' <"$T/apply.out")"
    else
        check dra.apply fail "$(cat "$T/apply.out")"
        return
    fi
    poll 60 sh -c "[ -n \"\$('$kubectl_bin' --kubeconfig '$T/admin.kubeconfig' -n wdp-system get pods -o name)\" ]"
    if poll 90 kubelet_registered_dra; then
        check dra.registered ok "$(kubelet_since_start | grep 'Registered DRA plugin\|Connection changed.*devices.wdp.dev' | tail -n 1 | cut -c1-300)"
    else
        check dra.registered fail "no 'Registered DRA plugin' in kubelet's log; kubelet: $(grep -i 'devices.wdp.dev' "$T/kubelet.log" | grep -i 'error\|fail' | tail -n 2 | cut -c1-400 | tr '\n' ';')"
    fi
    if poll 60 rollout_done; then
        check dra.daemonset ok "rollout complete, pod $(wdp_pod) ready"
    else
        check dra.daemonset fail "not ready: $(curl -s http://127.0.0.1:9464/readyz | tr '\n' ';')"
    fi
    if poll 60 slices_present; then
        check dra.slices ok "$(slice_devices) devices in the node's slices of devices.wdp.dev (accepted by the API server's validation and the admission policy); pools: $(k get resourceslices --field-selector spec.nodeName=$node -o jsonpath='{range .items[*]}{.spec.pool.name}/{.spec.driver}:{.spec.devices[0].name}..{"; "}{end}')"
    else
        check dra.slices fail "no slices of devices.wdp.dev for $node: $(k get resourceslices -o wide 2>&1 | tr '\n' ';')"
    fi
    # The device-plugin scanner beside it (serial) is no DRA driver; the Node has no kvm name.
    local cap
    cap=$(k get node "$node" -o jsonpath='{.status.capacity}')
    if echo "$cap" | grep -q 'devices.wdp.dev'; then
        check dra.no-device-plugin-name fail "the Node advertises a devices.wdp.dev name: $cap"
    else
        check dra.no-device-plugin-name ok "no devices.wdp.dev name in the Node's capacity: $cap"
    fi

    # A ResourceClaim of the class, allocated by the scheduler and prepared by kubelet through wdp.
    k apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: { name: kvm, namespace: default }
spec:
  devices:
    requests:
      - name: kvm
        exactly: { deviceClassName: kvm.devices.wdp.dev }
EOF
    pod_yaml dra-claim /dev/kvm "      resources: { claims: [{ name: kvm }] }" "  resourceClaims: [{ name: kvm, resourceClaimName: kvm }]" | k apply -f - >/dev/null
    local saw claim_uid names
    claim_uid=$(k get resourceclaim kvm -o jsonpath='{.metadata.uid}')
    if poll 90 pod_running dra-claim; then
        saw="allocated $(k get resourceclaim kvm -o jsonpath='{.status.allocation.devices.results[*].pool}/{.status.allocation.devices.results[*].device}'), reserved for $(k get resourceclaim kvm -o jsonpath='{.status.reservedFor[*].name}'); container: $(pod_log dra-claim)"
        check dra.claim ok "$saw"
    else
        check dra.claim fail "pod dra-claim $(pod_phase dra-claim); claim allocation: $(k get resourceclaim kvm -o jsonpath='{.status.allocation.devices.results}'); events: $(k get events --field-selector involvedObject.name=dra-claim -o jsonpath='{range .items[*]}{.reason}: {.message}{"; "}{end}' | cut -c1-600)"
    fi
    names=$(dra_cdi_names "$claim_uid" 2>/dev/null)
    if [ -n "$names" ] && saw=$(resolve_cdi $names); then
        check dra.cdi ok "kubelet's dra_manager_state for claim $claim_uid: $(echo "$saw" | tr '\n' ';'); the container (containerd $(containerd --version | awk '{print $3}'), whose CRI has no CDI field) sees: $(pod_log dra-claim)"
    else
        check dra.cdi fail "kubelet's dra_manager_state for claim $claim_uid: '$names' ${saw:-}"
    fi
    # Device health as kubelet reports it in the pod's status (ResourceHealthStatus): from the
    # driver's health stream, which kubelet opens by the service GetInfo advertises.
    health_known() { k get pod dra-claim -o jsonpath='{.status.containerStatuses[0].allocatedResourcesStatus}' | grep -q '"health":"Healthy"'; }
    if poll 30 health_known; then
        check dra.health ok "allocatedResourcesStatus: $(k get pod dra-claim -o jsonpath='{.status.containerStatuses[0].allocatedResourcesStatus}')"
    else
        check dra.health fail "allocatedResourcesStatus: $(k get pod dra-claim -o jsonpath='{.status.containerStatuses[0].allocatedResourcesStatus}'); kubelet: $(kubelet_since_start | grep 'WatchResources' | tail -n 2 | cut -c1-300 | tr '\n' ';')"
    fi
    local checkpoint=/var/lib/kubelet/plugins/devices.wdp.dev/checkpoint.json
    k delete pod dra-claim --wait=true --timeout=60s >/dev/null 2>&1
    claim_released() { [ -z "$(k get resourceclaim kvm -o jsonpath='{.status.reservedFor}')" ] && ! grep -q "$claim_uid" "$checkpoint" 2>/dev/null && [ -z "$(dra_cdi_names "$claim_uid")" ]; }
    if [ -n "$claim_uid" ] && [ -n "$names" ] && poll 60 claim_released; then
        check dra.unprepare ok "pod deleted: claim reservedFor empty, claim $claim_uid gone from wdp's checkpoint and kubelet's dra_manager_state"
    else
        check dra.unprepare fail "reservedFor='$(k get resourceclaim kvm -o jsonpath='{.status.reservedFor}')'; wdp checkpoint: $(head -c 300 "$checkpoint" 2>&1); kubelet state: $(dra_cdi_names "$claim_uid" 2>&1)"
    fi

    # kubelet's wipe at start and wdp's republish.
    local before
    before=$(slice_uids)
    kubelet_restart TERM
    slices_replaced() { local now; now=$(slice_uids); [ -n "$now" ] && [ "$now" != "$before" ] && slices_present; }
    if [ -n "$before" ] && poll 90 slices_replaced; then
        check dra.wipe-republish ok "slices $before wiped by the restarted kubelet, republished as $(slice_uids) with $(slice_devices) devices"
    else
        check dra.wipe-republish fail "slices before: '$before', after: '$(slice_uids)' ($(slice_devices) devices)"
    fi
    poll 90 node_ready
    poll 60 kubelet_registered_dra

    # The extended-resource bridge: limits: devices.wdp.dev/kvm on a node that never ran the
    # device plugin; the scheduler makes the claim.
    pod_yaml dra-bridge /dev/kvm "      resources: { limits: { devices.wdp.dev/kvm: 1 } }" "" | k apply -f - >/dev/null
    if poll 90 pod_running dra-bridge; then
        local ext_claim ext_uid
        ext_claim=$(k get pod dra-bridge -o jsonpath='{.status.extendedResourceClaimStatus.resourceClaimName}')
        ext_uid=$(k get resourceclaim "$ext_claim" -o jsonpath='{.metadata.uid}' 2>/dev/null)
        names=$(dra_cdi_names "$ext_uid" 2>/dev/null)
        saw="claim $ext_claim made by the scheduler, allocated $(k get resourceclaim "$ext_claim" -o jsonpath='{.status.allocation.devices.results[*].device}' 2>&1); CDI $(resolve_cdi $names 2>&1 | tr '\n' ';')"
        if [ -n "$ext_claim" ] && resolve_cdi $names >/dev/null; then check dra.bridge ok "$saw"; else check dra.bridge fail "$saw"; fi
    else
        check dra.bridge fail "pod dra-bridge $(pod_phase dra-bridge): $(k get events --field-selector involvedObject.name=dra-bridge -o jsonpath='{range .items[*]}{.reason}: {.message}{"; "}{end}' | cut -c1-600)"
    fi

    # `wdp status` and the metrics agree with the slices.
    local pod status
    pod=$(wdp_pod)
    status=$(k -n wdp-system exec "$pod" -- /usr/bin/wdp status --json 2>&1)
    saw=$(echo "$status" | python3 -c '
import json, sys
d = json.load(sys.stdin)
print("ready=%s not_ready=%s;" % (d["ready"], d["not_ready"]), "; ".join("scanner %s (%s): [%s]" % (s["name"], s["state"], ", ".join("%s registered=%s healthy=%s" % (r["name"], r["registered"], r["healthy"]) for r in s["resources"])) for s in d["scanners"]))' 2>&1)
    local m_healthy
    m_healthy=$(curl -s http://127.0.0.1:9464/metrics | grep '^wdp_resource_devices{' | grep 'devices.wdp.dev/' | grep '"healthy"' | awk '{s += $2} END {print s + 0}')
    saw="$saw; metrics healthy devices.wdp.dev/*: $m_healthy; slices: $(slice_devices) devices"
    if echo "$status" | python3 -c 'import json, sys; sys.exit(0 if json.load(sys.stdin)["ready"] else 1)' 2>/dev/null &&
        [ "$m_healthy" = "$(slice_devices)" ]; then
        check dra.status-metrics ok "$saw"
    else
        check dra.status-metrics fail "$saw"
    fi
    cp "$T/kubelet.log" "$T/kubelet-dra.log"
    k -n wdp-system logs --all-containers -l app.kubernetes.io/name=wdp --tail=-1 >"$T/wdp-dra.log" 2>&1
    k get events -A -o wide >"$T/events-dra.txt" 2>&1

    # Uninstall: both sockets go with the pod; kubelet deletes the driver's slices 30 s after
    # the driver became unusable, so the scheduler allocates no device of a node without wdp.
    k delete pod dra-bridge --wait=true --timeout=60s >/dev/null 2>&1
    k delete -k "$T/kust-dra" --wait=true --timeout=120s >/dev/null 2>&1
    local left
    left="plugins_registry: '$(ls /var/lib/kubelet/plugins_registry | tr '\n' ' ')', plugins/devices.wdp.dev: '$(ls /var/lib/kubelet/plugins/devices.wdp.dev 2>&1 | tr '\n' ' ')'"
    if [ -z "$(ls /var/lib/kubelet/plugins_registry)" ] && ! [ -e /var/lib/kubelet/plugins/devices.wdp.dev/dra.sock ]; then
        check dra.uninstall-sockets ok "$left"
    else
        check dra.uninstall-sockets fail "$left"
    fi
    slices_gone() { [ "$(slice_devices)" = 0 ]; }
    if poll 60 slices_gone; then
        check dra.uninstall-slices ok "the node's devices.wdp.dev slices deleted after the driver went"
    else
        check dra.uninstall-slices fail "60 s after the driver went, $(slice_devices) devices still published for $node (UIDs $(slice_uids))"
    fi
    cluster_down
}

echo "e2e: $(date -u +%FT%TZ), $("$kubectl_bin" version --client 2>/dev/null | head -n 1), $(etcd --version 2>/dev/null | head -n 1), $(containerd --version | awk '{print "containerd", $3}'), $(runc --version | head -n 1), wdp $("$WDP_BINARY" --version 2>/dev/null | head -n 1)"
[ "$E2E_ONLY" = dra ] || run_dp
[ "$E2E_ONLY" = dp ] || run_dra
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
