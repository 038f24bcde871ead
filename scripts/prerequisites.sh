#!/usr/bin/env bash
# Checks what `make demo` needs before it builds anything, and says how to install each missing
# piece (all of them, not only the first): Linux (inotify, /sys, /dev), Rust through rustup at
# the workspace's rust-version or later (rustup adds the wasm32-wasip2 target the guests build
# for), and a C compiler (ring and other crates compile C). Exits 1 when something is missing.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
need=$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)
missing=()

[[ $(uname -s) == Linux ]] || missing+=("Linux: wdp serves a Linux node's /sys and /dev (this is $(uname -s))")

rustup_hint="curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y, then . \"\$HOME/.cargo/env\" (https://rustup.rs)"
if ! command -v rustup >/dev/null; then
    missing+=("rustup and Rust $need or later: $rustup_hint")
elif ! command -v cargo >/dev/null || ! command -v rustc >/dev/null; then
    missing+=("Rust $need or later: rustup default stable")
else
    have=$(rustc --version 2>/dev/null | awk '{ print $2 }')
    oldest=$(printf '%s\n%s\n' "$need" "${have%%-*}" | sort -V | head -n 1)
    if [[ -z $have || $oldest != "$need" ]]; then
        missing+=("Rust $need or later (this is rustc ${have:-unknown}): rustup update stable")
    fi
fi

command -v cc >/dev/null ||
    missing+=("a C compiler, cc (ring and other dependencies compile C): apt-get install gcc libc6-dev")

if [[ ${#missing[@]} -gt 0 ]]; then
    echo "make demo needs, and this machine lacks:" >&2
    for m in "${missing[@]}"; do echo "  - $m" >&2; done
    exit 1
fi
