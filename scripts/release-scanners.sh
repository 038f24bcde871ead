#!/usr/bin/env bash
# Ships the bundled Rust scanners of a release as OCI artifacts signed in wdp's cosign format,
# with `wdp push` and `wdp sign` (the same code a scanner author uses: docs/src/authors/shipping.md, "Shipping scanners
# as OCI artifacts"). Run by `make release` (scripts/release.sh); tests/tests/release.rs runs it
# on the test build.
#
#   scripts/release-scanners.sh --wdp BIN --key KEY --out DIR [--registry REG] [--insecure]
#
# --wdp       the wdp binary that pushes and signs
# --key       the signing key: an unencrypted PKCS#8 PEM P-256 private key (`wdp sign --key`)
# --out       where to write scanners.txt (and, without --registry, the OCI image layouts)
# --registry  push to REG/scanners/<name>:VERSION and sign there (credentials as for `wdp push`:
#             WDP_REGISTRY_USERNAME/PASSWORD or the docker config file); --insecure: plain HTTP
#
# Without --registry each scanner becomes an OCI image layout, DIR/scanners/<name>/ (oci-layout,
# index.json, blobs/sha256/), holding the artifact tagged VERSION and its signature tagged
# sha256-<hex>.sig, as a registry would hold them: they are pushed to a throwaway registry on
# 127.0.0.1 (Debian's docker-registry, which `make setup` installs for the tests) and copied out
# through the registry API, so the layouts are byte for byte what `wdp push` and `wdp sign` sent.
# Copy one into a registry with both tags, e.g. `oras cp --from-oci-layout
# DIR/scanners/kvm:0.1.0 REG/scanners/kvm:0.1.0`, and the same for the .sig tag.
#
# DIR/scanners.txt: one line per scanner, `<name> <reference>@sha256:<manifest digest>`; the
# reference is REG/scanners/<name> (or, for layouts, scanners/<name>), to pin in a config.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
guests=$root/target/guests/wasm32-wasip2/release
wdp=
key=
out=
registry=
insecure=()

die() { echo "release-scanners.sh: $*" >&2; exit 1; }

while [[ $# -gt 0 ]]; do
    case $1 in
        --wdp) [[ $# -ge 2 ]] || die "--wdp needs a path"; wdp=$2; shift 2 ;;
        --key) [[ $# -ge 2 ]] || die "--key needs a path"; key=$2; shift 2 ;;
        --out) [[ $# -ge 2 ]] || die "--out needs a path"; out=$2; shift 2 ;;
        --registry) [[ $# -ge 2 ]] || die "--registry needs a name"; registry=${2%/}; shift 2 ;;
        --insecure) insecure=(--insecure); shift ;;
        *) die "unknown argument $1" ;;
    esac
done
[[ -x $wdp ]] || die "--wdp: ${wdp:-(none)} is not an executable"
[[ -f $key ]] || die "--key: ${key:-(none)} is not a file (make a key: openssl ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8 -nocrypt -out release.pem)"
[[ -n $out ]] || die "--out is required"
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)
[[ -n $version ]] || die "no version in Cargo.toml"
# The bundled scanners: the list the image ships (one list, in scripts/image.sh).
scanners=$(sed -n 's/^scanners="\(.*\)"$/\1/p' "$root/scripts/image.sh")
[[ -n $scanners ]] || die "no scanners=\"...\" line in scripts/image.sh"

mkdir -p "$out"
tmp=$(mktemp -d -t wdp-release.XXXXXX)
registry_pid=
cleanup() {
    if [[ -n $registry_pid ]]; then
        kill -TERM "$registry_pid" 2>/dev/null || true
        wait "$registry_pid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

local_registry=
if [[ -z $registry ]]; then
    command -v docker-registry >/dev/null ||
        die "docker-registry is missing (make setup-registry installs it: apt-get install docker-registry)"
    command -v python3 >/dev/null || die "python3 is missing (apt-get install python3)"
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    local_registry=127.0.0.1:$port
    cat >"$tmp/registry.yml" <<EOF
version: 0.1
log: {level: error}
storage: {filesystem: {rootdirectory: $tmp/storage}}
http: {addr: $local_registry}
EOF
    docker-registry serve "$tmp/registry.yml" >"$tmp/registry.log" 2>&1 &
    registry_pid=$!
    for _ in $(seq 200); do
        python3 -c "import urllib.request; urllib.request.urlopen('http://$local_registry/v2/')" 2>/dev/null && break
        kill -0 "$registry_pid" 2>/dev/null || die "docker-registry exited: $(cat "$tmp/registry.log")"
        sleep 0.05
    done
    registry=$local_registry
    insecure=(--insecure)
fi

# A version is released once: a scanner already under this version's tag there is refused
# before anything is pushed (tags are never moved: docs/src/versioning.md).
if [[ -z $local_registry ]]; then
    for name in $scanners; do
        if "$wdp" inspect "${insecure[@]}" "$registry/scanners/$name:$version" >/dev/null 2>&1; then
            die "$registry/scanners/$name:$version exists already: a released version's tags are never moved (set a new version in Cargo.toml)"
        fi
    done
fi

: >"$out/scanners.txt"
for name in $scanners; do
    component=$guests/$name.wasm
    [[ -f $component ]] || die "$component is missing (make rust-guests builds it)"
    repo=$registry/scanners/$name
    digest=$("$wdp" push "${insecure[@]}" "$component" "$repo:$version")
    [[ $digest == sha256:* ]] || die "wdp push $name printed ${digest:-nothing}, not a digest"
    "$wdp" sign "${insecure[@]}" --key "$key" "$repo@$digest" >/dev/null
    if [[ -n $local_registry ]]; then
        python3 - "$local_registry" "scanners/$name" "$out/scanners/$name" \
            "$version" "${digest/:/-}.sig" <<'PY'
# Copies tags of one repository out of a registry into an OCI image layout, checking every
# blob's digest on the way.
import hashlib, json, os, sys, urllib.request

addr, repo, layout, *tags = sys.argv[1:]
MANIFEST = "application/vnd.oci.image.manifest.v1+json"

def get(path, accept=None):
    req = urllib.request.Request(f"http://{addr}/v2/{repo}/{path}")
    if accept:
        req.add_header("Accept", accept)
    with urllib.request.urlopen(req) as r:
        return r.read()

def store(data, digest=None):
    actual = "sha256:" + hashlib.sha256(data).hexdigest()
    if digest is not None and digest != actual:
        sys.exit(f"{repo}: blob {digest} has digest {actual}")
    path = os.path.join(layout, "blobs", "sha256", actual.split(":", 1)[1])
    with open(path, "wb") as f:
        f.write(data)
    return actual

os.makedirs(os.path.join(layout, "blobs", "sha256"), exist_ok=True)
index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []}
for tag in tags:
    body = get(f"manifests/{tag}", MANIFEST)
    manifest = json.loads(body)
    if manifest.get("mediaType", MANIFEST) != MANIFEST:
        sys.exit(f"{repo}:{tag}: manifest media type {manifest.get('mediaType')}, not {MANIFEST}")
    for blob in [manifest["config"], *manifest["layers"]]:
        store(get(f"blobs/{blob['digest']}"), blob["digest"])
    index["manifests"].append({
        "mediaType": MANIFEST,
        "digest": store(body),
        "size": len(body),
        "annotations": {"org.opencontainers.image.ref.name": tag},
    })
with open(os.path.join(layout, "index.json"), "w") as f:
    json.dump(index, f, indent=2)
with open(os.path.join(layout, "oci-layout"), "w") as f:
    json.dump({"imageLayoutVersion": "1.0.0"}, f)
PY
        repo=scanners/$name
    fi
    echo "$name $repo@$digest" >>"$out/scanners.txt"
    echo "release-scanners: $name $repo@$digest (signed)"
done
