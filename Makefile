# wdp: WebAssembly device plugins.
#   make demo   build everything and serve this machine's devices to a kubelet stand-in
#   make test   build everything, check formatting and lints, run every test
# Both install what they need (the wasm32-wasip2 Rust target) on a fresh machine.

CARGO ?= cargo
GUEST_TARGET_DIR := target/guests
GUEST_MANIFEST := guest-scanners/Cargo.toml
GUEST_CARGO := $(CARGO) build --manifest-path $(GUEST_MANIFEST) --target wasm32-wasip2 --release --locked --target-dir $(GUEST_TARGET_DIR)
WDP := target/debug/wdp
# How long `make demo` runs (e.g. DEMO_DURATION=20s); empty: until Ctrl-C.
DEMO_DURATION ?=

.PHONY: all setup build guests host test lint fuzz demo clean

all: build

## setup: install what the build and tests need (idempotent): the wasm32-wasip2 target, and
## Debian's docker-registry (a real OCI registry for the OCI tests, run on 127.0.0.1 by them)
setup:
	@rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2
	@command -v docker-registry >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-registry >/dev/null; }

## guests: build every guest component (scanners, hooks, test guests) for wasm32-wasip2
guests: setup
	$(GUEST_CARGO)

## host: build the wdp binary and the test targets in one go (dev profile, with an optimised
## wasm compiler): one feature resolution for both, so `make test` never compiles wasmtime twice
host:
	$(CARGO) build --locked --workspace --all-targets

build: guests host

## lint: formatting and clippy, host and guest workspaces
lint: setup
	$(CARGO) fmt --all --check
	cd guest-scanners && $(CARGO) fmt --all --check
	$(CARGO) clippy --locked --workspace --all-targets -- -D warnings
	$(CARGO) clippy --locked --manifest-path $(GUEST_MANIFEST) --target wasm32-wasip2 --target-dir $(GUEST_TARGET_DIR) -- -D warnings

## test: everything CI runs
test: build lint
	$(CARGO) test --locked --manifest-path $(GUEST_MANIFEST) --target-dir $(GUEST_TARGET_DIR)
	$(CARGO) test --locked --workspace

## fuzz: the property tests behind the fuzzing claims, with many more cases than `make test`
## (FUZZ_CASES, default 50000; FUZZ_SEED picks another fixed seed)
FUZZ_CASES ?= 50000
fuzz:
	WDP_FUZZ_CASES=$(FUZZ_CASES) $(if $(FUZZ_SEED),WDP_FUZZ_SEED=$(FUZZ_SEED)) $(CARGO) test --locked -p wdp --lib fuzz

## demo: serve this machine's real /sys and /dev to an embedded kubelet stand-in
demo: build
	DEMO_DURATION=$(DEMO_DURATION) scripts/demo.sh $(WDP) demo/wdp.yaml

clean:
	$(CARGO) clean
