#!/bin/sh
# Builds wdp's image (Containerfile) from files this machine already has, without pulling
# anything: the image is `FROM scratch`, so this script stages everything it holds into a build
# context under target/image/ and runs `podman build` (buildah if podman is absent) on it.
#
#   scripts/image.sh [--binary PATH] [--tag NAME]...
#
# --binary  the wdp binary to ship (default target/release/wdp, what `make image` builds; the
#           image test passes the test build's target/debug/wdp); stripped of debug info and symbols
# --tag     the image's names (default localhost/wdp:VERSION: a version tag only, never moved)
#
# Staged: the binary at /usr/bin/wdp; the shared libraries `ldd` lists for it (glibc's libc,
# libm, the loader, libgcc_s), each at the path ldd prints, which is where the binary's loader
# and its default search path find them; Debian's CA bundle at /etc/ssl/certs/ca-certificates.crt
# (the first file rustls-native-certs' probe looks for, for oci:// pulls); the twelve bundled Rust
# scanners at /usr/lib/wdp/scanners/<name>.wasm (built by `make rust-guests`), and those scanners
# compiled by the staged binary itself (`wdp precompile`) at /usr/lib/wdp/compiled, which
# `wdp run` loads before compiling: compiled for this machine's CPU features, so a node whose CPU
# lacks one of them misses and compiles as it would without them.
# Podman and buildah honour CONTAINERS_CONF and CONTAINERS_STORAGE_CONF (the test keeps its
# images in a storage of its own that way).
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
# The bundled Rust scanners (guest-scanners/ without the SDK and the test guests).
scanners="dlb generic gpu idxd kvm npu nvidia qat serial sgx usb vfio"
guests=$root/target/guests/wasm32-wasip2/release
context=$root/target/image
binary=$root/target/release/wdp
tags=

die() { echo "image.sh: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case $1 in
        --binary) [ $# -ge 2 ] || die "--binary needs a path"; binary=$2; shift 2 ;;
        --tag) [ $# -ge 2 ] || die "--tag needs a name"; tags="$tags $2"; shift 2 ;;
        *) die "unknown argument $1 (usage: scripts/image.sh [--binary PATH] [--tag NAME]...)" ;;
    esac
done
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)
[ -n "$version" ] || die "no version in Cargo.toml"
[ -n "$tags" ] || tags="localhost/wdp:$version"
[ -x "$binary" ] || die "$binary is missing (make image builds it)"

if command -v podman >/dev/null; then
    build="podman build"
elif command -v buildah >/dev/null; then
    build="buildah build"
else
    die "neither podman nor buildah is installed (make setup-podman installs podman)"
fi

rm -rf "$context"
mkdir -p "$context/lib" "$context/etc/ssl/certs" "$context/scanners"

# The binary, without debug info or symbols (the release profile strips both already; a dev build
# keeps line tables worth two thirds of its size). A panic's backtrace then names no function,
# which only a developer's build needs.
strip --strip-all -o "$context/wdp" "$binary"

# Every library the binary links, and the loader: `ldd` prints "name => /path (addr)" for
# libraries and "/path (addr)" for the loader; linux-vdso has no file.
libs=$(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')
[ -n "$libs" ] || die "ldd lists no library for $binary (a static binary needs none: drop this step)"
for lib in $libs; do
    mkdir -p "$context/lib$(dirname "$lib")"
    # The file itself, not the distribution's symlink to it (the image has no /lib -> usr/lib).
    cp -L "$lib" "$context/lib$lib"
done

cp -L /etc/ssl/certs/ca-certificates.crt "$context/etc/ssl/certs/ca-certificates.crt" ||
    die "Debian's CA bundle is missing (apt-get install ca-certificates)"

for name in $scanners; do
    [ -f "$guests/$name.wasm" ] || die "$guests/$name.wasm is missing (make rust-guests builds it)"
    cp "$guests/$name.wasm" "$context/scanners/"
done

# The staged scanners compiled by the staged binary, with `wdp run`'s engine settings: the files
# the image's scanners are, so their entries are the ones `wdp run` looks for. Logs at warn only:
# the entries' paths (stdout) are noise here.
set --
for name in $scanners; do set -- "$@" "$context/scanners/$name.wasm"; done
RUST_LOG=warn "$context/wdp" precompile --out "$context/compiled" "$@" >/dev/null ||
    die "wdp precompile failed"

set --
for tag in $tags; do set -- "$@" --tag "$tag"; done
# chroot isolation: the Containerfile has no RUN step, and chroot needs no user namespace or
# cgroup setup from this machine.
$build --isolation chroot --file "$root/Containerfile" --label "org.opencontainers.image.version=$version" "$@" "$context"
