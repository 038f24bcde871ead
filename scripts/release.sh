#!/usr/bin/env bash
# Writes a release of wdp, the version in Cargo.toml, into dist/ (`make release` runs it):
#
#   dist/wdp-VERSION-image.oci.tar   the image (scripts/image.sh), tagged IMAGE:VERSION, as an OCI
#                                    archive (`podman load -i`, `skopeo copy oci-archive:...`)
#   dist/scanners.txt                the bundled scanners as signed OCI artifacts, by digest
#   dist/scanners/<name>/            without a registry: each one an OCI image layout
#   dist/cosign.pub                  the public half of the signing key (`verify-key` in a config,
#                                    `cosign verify --key`)
#   dist/wdp-VERSION.cdx.json        the binary's SBOM (CycloneDX, from Cargo.lock: cargo-cyclonedx)
#   dist/deploy/                     deploy/ with the image pinned: `kubectl apply -k dist/deploy`
#   dist/SHA256SUMS                  every other file's sha256 (`cd dist && sha256sum -c SHA256SUMS`)
#
#   scripts/release.sh --binary BIN --key KEY [--registry REG] [--insecure] [--dist DIR]
#
# IMAGE is REG/wdp with --registry (the image is pushed there, and the scanners to
# REG/scanners/<name>:VERSION), else localhost/wdp. A version is released once: its tags are
# never moved (docs/src/versioning.md), so the DaemonSet rolls exactly when the version changes.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
binary=
key=
registry=
insecure=()
dist=$root/dist
cyclonedx=${CARGO_CYCLONEDX:-cargo-cyclonedx}

die() { echo "release.sh: $*" >&2; exit 1; }

while [[ $# -gt 0 ]]; do
    case $1 in
        --binary) [[ $# -ge 2 ]] || die "--binary needs a path"; binary=$2; shift 2 ;;
        --key) [[ $# -ge 2 ]] || die "--key needs a path"; key=$2; shift 2 ;;
        --registry) [[ $# -ge 2 ]] || die "--registry needs a name"; registry=${2%/}; shift 2 ;;
        --insecure) insecure=(--insecure); shift ;;
        --dist) [[ $# -ge 2 ]] || die "--dist needs a path"; dist=$2; shift 2 ;;
        *) die "unknown argument $1" ;;
    esac
done
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)
[[ -n $version ]] || die "no version in Cargo.toml"
[[ -x $binary ]] || die "--binary: ${binary:-(none)} is not an executable"
[[ -f $key ]] || die "--key: ${key:-(none)} is missing: SIGN_KEY=FILE, an unencrypted PKCS#8 P-256 key (openssl ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8 -nocrypt -out release.pem)"
for tool in podman openssl sha256sum python3 "$cyclonedx"; do
    command -v "$tool" >/dev/null || die "$tool is missing (make release installs podman and cargo-cyclonedx; the others: apt-get install openssl coreutils python3)"
done
# The changelog names the version being released (tests/tests/release.rs checks the same).
grep -q "^## \[$version\]" "$root/CHANGELOG.md" || die "CHANGELOG.md has no section for $version"

image=${registry:-localhost}/wdp
if [[ -n $registry ]]; then
    # A released version's tags are never moved: refuse before building anything.
    tls=()
    [[ ${#insecure[@]} -eq 0 ]] || tls=(--tls-verify=false)
    if podman search "${tls[@]}" --list-tags --limit 10000 "$image" 2>/dev/null |
        awk 'NR > 1 { print $2 }' | grep -qxF "$version"; then
        die "$image:$version exists already: a released version's tags are never moved (set a new version in Cargo.toml)"
    fi
fi
rm -rf "$dist"
mkdir -p "$dist"

# The image, tagged with the version only.
"$root/scripts/image.sh" --binary "$binary" --tag "$image:$version"
podman save --format oci-archive -o "$dist/wdp-$version-image.oci.tar" "$image:$version"
[[ -z $registry ]] || podman push "${tls[@]}" "$image:$version"

# The scanners, signed.
registry_args=()
[[ -z $registry ]] || registry_args=(--registry "$registry" "${insecure[@]}")
"$root/scripts/release-scanners.sh" --wdp "$binary" --key "$key" --out "$dist" "${registry_args[@]}"
openssl ec -in "$key" -pubout -out "$dist/cosign.pub" 2>/dev/null || die "$key: not an EC private key"

# The SBOM of the wdp binary: its dependencies as Cargo.lock resolves them for this target,
# without build-time ones. cargo-cyclonedx writes one file beside each workspace member's
# manifest that has a binary: the host's is kept, the others (the bench's) removed.
"$cyclonedx" cyclonedx --manifest-path "$root/Cargo.toml" --format json --spec-version 1.5 \
    --describe binaries --no-build-deps --quiet
mv "$root/host/wdp_bin.cdx.json" "$dist/wdp-$version.cdx.json"
find "$root" \( -path "$root/target" -o -path "$root/guest-scanners" -o -path "$dist" \) -prune \
    -o -name '*_bin.cdx.json' -exec rm -f {} +

# deploy/ with the image pinned to this release.
"$root/scripts/pin-deploy.sh" "$dist/deploy" "$image" "$version"

(cd "$dist" && find . -type f ! -name SHA256SUMS -printf '%P\n' | LC_ALL=C sort | xargs -d '\n' sha256sum >SHA256SUMS)
echo "release: wdp $version in $dist (image $image:$version)"
