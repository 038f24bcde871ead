#!/usr/bin/env bash
# Builds one non-Rust guest into target/guests/<lang>/<name>.wasm, with the toolchains that
# scripts/setup-toolchains.sh installed (the Makefile's `guests` target calls this for every guest,
# only when a source changed). Prints what the build cost and the component's size.
#
#   scripts/build-lang-guest.sh python <name>   guest-scanners/python/<name>/app.py, componentize-py
#   scripts/build-lang-guest.sh js <name>       guest-scanners/js/<name>/app.js, componentize-js
#   scripts/build-lang-guest.sh c <name>        guest-scanners/c/<name>/*.c, wit-bindgen c + clang
#                                               + wasm-tools component new (preview1 adapter)
#
# The world is fixed per language here (each guest's header comment says which): python and c
# guests implement `scanner-plugin`; js guests `device-plugin-env` (device-plugin + environment,
# see guest-scanners/js/wit/world.wit).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

lang=${1:?usage: build-lang-guest.sh python|js|c NAME}
name=${2:?usage: build-lang-guest.sh python|js|c NAME}
TOOLS=${TOOLS:-$ROOT/target/tools}
src="$ROOT/guest-scanners/$lang/$name"
out_dir="$ROOT/target/guests/$lang"
out="$out_dir/$name.wasm"
build="$out_dir/build/$name"
ADAPTER_VERSION=48.0.8

missing() {
    echo "build-lang-guest: $1 is missing: run \`make setup\` (scripts/setup-toolchains.sh) first" >&2
    exit 1
}

[[ -d "$src" ]] || { echo "build-lang-guest: no guest $src" >&2; exit 1; }
rm -rf "$build"
mkdir -p "$build" "$out_dir"
start=$SECONDS

case "$lang" in
python)
    py="$TOOLS/venv/bin/componentize-py"
    [[ -x "$py" ]] || missing "$py"
    # -p: the guest's own directory is its module path (app.py and the modules it imports).
    (cd "$src" && "$py" -d "$ROOT/wit" -w scanner-plugin componentize app -p . -o "$build/$name.wasm") \
        2>&1 | grep -v '^Component built successfully$' || true
    ;;
js)
    cjs="$TOOLS/js/node_modules/.bin/componentize-js"
    [[ -x "$cjs" ]] || missing "$cjs"
    # componentize-js sees only files under its working directory: gather the guest's modules and
    # the WIT (the JS worlds plus the contract as a dependency) in the build directory.
    cp "$src"/*.js "$build/"
    rm -f "$build"/*.test.js
    cp -r "$ROOT/guest-scanners/js/wit" "$build/wit"
    mkdir -p "$build/wit/deps/wdp-device-plugin"
    cp "$ROOT/wit/device-plugin.wit" "$build/wit/deps/wdp-device-plugin/"
    # -d http fetch-event: no wasi:http import (the host has none); see docs/src/authors/javascript.md.
    (cd "$build" && "$cjs" --wit wit -n device-plugin-env -d http fetch-event -o "$name.wasm" app.js)
    ;;
c)
    wit_bindgen="$TOOLS/bin/wit-bindgen"
    wasm_tools="$TOOLS/bin/wasm-tools"
    adapter="$TOOLS/adapters/wasi_snapshot_preview1.reactor-$ADAPTER_VERSION.wasm"
    for tool in "$wit_bindgen" "$wasm_tools" "$adapter"; do [[ -e "$tool" ]] || missing "$tool"; done
    command -v clang >/dev/null || missing clang
    # (it lists each file it writes on stderr: shown only when it fails)
    "$wit_bindgen" c --world scanner-plugin --out-dir "$build/bindings" "$ROOT/wit" \
        >"$build/wit-bindgen.log" 2>&1 || { cat "$build/wit-bindgen.log" >&2; exit 1; }
    cflags=(--target=wasm32-wasi -O2 -std=c11 -I"$build/bindings")
    # The generated bindings are compiled as they are; our sources with every warning an error.
    clang "${cflags[@]}" -c "$build/bindings/scanner_plugin.c" -o "$build/bindings.o"
    objs=("$build/bindings.o" "$build/bindings/scanner_plugin_component_type.o")
    for c in "$src"/*.c; do
        case "$(basename "$c")" in test_*) continue ;; esac
        o="$build/$(basename "$c" .c).o"
        clang "${cflags[@]}" -Wall -Wextra -Werror -c "$c" -o "$o"
        objs+=("$o")
    done
    # A reactor (library) module: no main; the component's exports are its entry points.
    clang --target=wasm32-wasi -mexec-model=reactor -O2 -Wl,--strip-debug -o "$build/$name.core.wasm" "${objs[@]}"
    "$wasm_tools" component new "$build/$name.core.wasm" \
        --adapt "wasi_snapshot_preview1=$adapter" -o "$build/$name.wasm"
    ;;
*)
    echo "build-lang-guest: unknown language $lang (python, js or c)" >&2
    exit 1
    ;;
esac

mv "$build/$name.wasm" "$out"
size=$(stat -c %s "$out")
echo "build-lang-guest: $lang/$name: $((SECONDS - start)) s, $out ($((size / 1024)) KiB)"
