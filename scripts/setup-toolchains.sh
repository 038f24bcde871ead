#!/usr/bin/env bash
# Installs the toolchains of wdp's Python, JavaScript and C guests, from the package registries
# only, pinned, idempotently (a step whose result is present is skipped). Run by `make setup` as
# root on a fresh Debian 12 machine; prints what each step cost.
#
#   Debian    clang, lld, wasi-libc, libclang-rt-dev-wasm32  (the C guests' compiler and libc)
#   crates.io wasm-tools, wit-bindgen-cli (C bindings)        -> $TOOLS/bin
#   crates.io cargo-component, wkg (Rust components, WIT packages by name) -> $TOOLS/bin
#   crates.io the wasi_snapshot_preview1 reactor adapter      -> $TOOLS/adapters
#             (crate wasi-preview1-component-adapter-provider, the host's wasmtime version)
#   PyPI      componentize-py (guest-scanners/python/requirements.txt) -> $TOOLS/venv
#   npm       componentize-js, jco (guest-scanners/js/package-lock.json) -> $TOOLS/js
#
# TOOLS defaults to target/tools (so `cargo clean` or a fresh clone starts over; CI installs into
# its own clone). Versions live here and in the two lock/requirements files, nowhere else.
set -euo pipefail
cd "$(dirname "$0")/.."

TOOLS=${TOOLS:-target/tools}
WASM_TOOLS_VERSION=1.263.0
WIT_BINDGEN_VERSION=0.63.0
CARGO_COMPONENT_VERSION=0.21.1
WKG_VERSION=0.16.1
# The adapter must speak the WASI 0.2 the host provides: the wasmtime version Cargo.lock holds
# (wasmtime is required as ~48.0.8, so a 48.0.x patch arrives through `cargo update`).
ADAPTER_VERSION=$(awk '$0 == "name = \"wasmtime\"" { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)
[[ -n "$ADAPTER_VERSION" ]] || { echo "setup-toolchains: no wasmtime version in Cargo.lock" >&2; exit 1; }
APT_PACKAGES=(clang lld wasi-libc libclang-rt-dev-wasm32)

mkdir -p "$TOOLS"
TOOLS=$(cd "$TOOLS" && pwd)

# step NAME COMMAND...: runs COMMAND and reports its wall time.
step() {
    local name=$1
    shift
    local start=$SECONDS
    echo "setup: $name ..."
    "$@"
    echo "setup: $name: done in $((SECONDS - start)) s"
}

skip() { echo "setup: $1: present, skipped"; }

# --- Debian: the C toolchain -------------------------------------------------------------------
apt_missing() {
    local p
    for p in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || return 0
    done
    return 1
}
apt_install() {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${APT_PACKAGES[@]}" >/dev/null
}
if apt_missing; then step "apt ${APT_PACKAGES[*]}" apt_install; else skip "apt ${APT_PACKAGES[*]}"; fi

# --- crates.io: wasm-tools and wit-bindgen -----------------------------------------------------
# Only the features the build uses, and unoptimised without debug info (`--debug`,
# CARGO_PROFILE_DEV_DEBUG=0): on 2 cores that builds in about a quarter of the time of a release
# build, and the tools then take well under a second on a guest (their output is identical).
cargo_install() {
    CARGO_PROFILE_DEV_DEBUG=0 cargo install --quiet --locked --debug --root "$TOOLS" "$@"
}
if [[ "$("$TOOLS/bin/wasm-tools" --version 2>/dev/null)" == "wasm-tools $WASM_TOOLS_VERSION"* ]]; then
    skip "wasm-tools $WASM_TOOLS_VERSION"
else
    step "cargo install wasm-tools $WASM_TOOLS_VERSION" \
        cargo_install --no-default-features --features component wasm-tools@"$WASM_TOOLS_VERSION"
fi
if [[ "$("$TOOLS/bin/wit-bindgen" --version 2>/dev/null)" == "wit-bindgen-cli $WIT_BINDGEN_VERSION"* ]]; then
    skip "wit-bindgen-cli $WIT_BINDGEN_VERSION"
else
    step "cargo install wit-bindgen-cli $WIT_BINDGEN_VERSION" \
        cargo_install --no-default-features --features c wit-bindgen-cli@"$WIT_BINDGEN_VERSION"
fi

# cargo-component builds for wasm32-wasip1 and adapts the module (it adds that target itself when
# missing; installed here so a build never needs rustup).
rustup target list --installed | grep -qx wasm32-wasip1 || step "rustup target add wasm32-wasip1" rustup target add wasm32-wasip1
# Both with all their defaults: registries need their TLS and auth code.
if [[ "$("$TOOLS/bin/cargo-component" --version 2>/dev/null)" == *" $CARGO_COMPONENT_VERSION"* ]]; then
    skip "cargo-component $CARGO_COMPONENT_VERSION"
else
    step "cargo install cargo-component $CARGO_COMPONENT_VERSION" cargo_install cargo-component@"$CARGO_COMPONENT_VERSION"
fi
if [[ "$("$TOOLS/bin/wkg" --version 2>/dev/null)" == "wkg $WKG_VERSION"* ]]; then
    skip "wkg $WKG_VERSION"
else
    step "cargo install wkg $WKG_VERSION" cargo_install wkg@"$WKG_VERSION"
fi

# --- crates.io: the preview1 adapter -----------------------------------------------------------
# wasi-libc in Debian 12 targets wasm32-wasi (preview 1); `wasm-tools component new` turns such a
# module into a component with this adapter. The crate ships the adapter's bytes; cargo fetches it
# (checksum checked against the index) and we copy the file out of its source.
ADAPTER="$TOOLS/adapters/wasi_snapshot_preview1.reactor-$ADAPTER_VERSION.wasm"
fetch_adapter() {
    local dir="$TOOLS/adapter-fetch"
    mkdir -p "$dir/src" "$(dirname "$ADAPTER")"
    : >"$dir/src/lib.rs"
    cat >"$dir/Cargo.toml" <<EOF
# Generated by scripts/setup-toolchains.sh: only fetches the adapter crate; never built.
[package]
name = "wdp-adapter-fetch"
version = "0.0.0"
edition = "2021"
publish = false
[dependencies]
wasi-preview1-component-adapter-provider = "=$ADAPTER_VERSION"
[workspace]
EOF
    cargo fetch --quiet --manifest-path "$dir/Cargo.toml"
    local src
    src=$(cargo metadata --format-version 1 --manifest-path "$dir/Cargo.toml" | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == "wasi-preview1-component-adapter-provider":
        print(p["manifest_path"].rsplit("/", 1)[0])')
    cp "$src/artefacts/wasi_snapshot_preview1.reactor.wasm" "$ADAPTER.tmp"
    mv "$ADAPTER.tmp" "$ADAPTER"
}
if [[ -s "$ADAPTER" ]]; then skip "wasi adapter $ADAPTER_VERSION"; else step "wasi adapter $ADAPTER_VERSION (crates.io)" fetch_adapter; fi

# --- PyPI: componentize-py --------------------------------------------------------------------
REQS=guest-scanners/python/requirements.txt
python_install() {
    [[ -x "$TOOLS/venv/bin/pip" ]] || python3 -m venv "$TOOLS/venv"
    "$TOOLS/venv/bin/pip" install --quiet --disable-pip-version-check -r "$REQS"
    cp "$REQS" "$TOOLS/venv/requirements.installed"
}
if cmp -s "$REQS" "$TOOLS/venv/requirements.installed" && [[ -x "$TOOLS/venv/bin/componentize-py" ]]; then
    skip "pip $(grep -v '^#' "$REQS" | xargs)"
else
    step "pip $(grep -v '^#' "$REQS" | xargs)" python_install
fi

# --- npm: componentize-js ----------------------------------------------------------------------
LOCK=guest-scanners/js/package-lock.json
npm_install() {
    mkdir -p "$TOOLS/js"
    cp guest-scanners/js/package.json "$LOCK" "$TOOLS/js/"
    (cd "$TOOLS/js" && npm ci --no-audit --no-fund --loglevel=error)
}
if cmp -s "$LOCK" "$TOOLS/js/package-lock.json" && [[ -x "$TOOLS/js/node_modules/.bin/componentize-js" ]]; then
    skip "npm ci (componentize-js)"
else
    step "npm ci (componentize-js)" npm_install
fi
