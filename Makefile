# wdp: WebAssembly device plugins.
#   make demo   build the wdp binary and the Rust guests, serve this machine's devices to a kubelet
#               stand-in
#   make test   build everything, check formatting and lints, run every test
#   make image  build the shipped image (Containerfile) with podman: localhost/wdp:VERSION
#   make release  dist/: the image archive, the signed scanners, an SBOM, checksums, deploy/
#               pinned to VERSION (docs/src/versioning.md)
#   make book   the book under docs/ (mdbook) into target/book
#   make e2e KUBE_BIN_DIR=DIR  run wdp's image and deploy/ in a real single-node cluster made of
#               the Kubernetes binaries in DIR (tests/e2e/run.sh); not part of `make test`
# Both install what they need (the wasm32-wasip2 Rust target, and the Python, JavaScript and C
# guest toolchains: scripts/setup-toolchains.sh) on a fresh machine.

CARGO ?= cargo
GUEST_TARGET_DIR := target/guests
GUEST_MANIFEST := guest-scanners/Cargo.toml
GUEST_CARGO := $(CARGO) build --manifest-path $(GUEST_MANIFEST) --target wasm32-wasip2 --release --locked --target-dir $(GUEST_TARGET_DIR)
WDP := target/debug/wdp
# Guests in other languages (guest-scanners/{python,js,c}/<name>/), each built by
# scripts/build-lang-guest.sh into target/guests/<lang>/<name>.wasm with the toolchains that
# scripts/setup-toolchains.sh installs under target/tools.
LANG_GUESTS := target/guests/python/hidraw.wasm target/guests/js/sound.wasm target/guests/c/v4l.wasm
# Everything a language's build depends on besides the guest's own sources.
PY_TOOLCHAIN := wit/device-plugin.wit guest-scanners/python/requirements.txt scripts/build-lang-guest.sh
JS_TOOLCHAIN := wit/device-plugin.wit $(wildcard guest-scanners/js/wit/*.wit guest-scanners/js/wit/deps/*/*.wit) guest-scanners/js/package-lock.json scripts/build-lang-guest.sh
C_TOOLCHAIN := wit/device-plugin.wit scripts/setup-toolchains.sh scripts/build-lang-guest.sh
# The contract as a WIT package (the wasm form `wkg get` fetches and `wkg publish` pushes).
WIT_PACKAGE := target/wit/wdp_device-plugin@0.1.2.wasm
# Where scripts/setup-toolchains.sh installs the guest toolchains.
TOOLS ?= target/tools
# How long `make demo` runs (e.g. DEMO_DURATION=20s); empty: until Ctrl-C.
DEMO_DURATION ?=

.PHONY: all setup setup-rust setup-podman setup-registry image release e2e build guests rust-guests lang-guests wit-package host wdp test test-lang-units lint proto fuzz demo bench soak audit book clean

all: build

## setup: install what the build and tests need (idempotent): the wasm32-wasip2 target, Debian's
## docker-registry (a real OCI registry for the OCI tests, run on 127.0.0.1 by them), and the
## Python/JavaScript/C guest toolchains, pinned (scripts/setup-toolchains.sh)
setup: setup-rust setup-podman setup-registry
	@scripts/setup-toolchains.sh

## setup-podman: Debian's podman and runc, a real container runtime for `make image` and for the
## tests that run the shipped image and resolve CDI devices (crun, podman's default, refuses some
## cgroup layouts), and a C compiler that links statically (the one-program images of those
## tests; its binutils give scripts/image.sh `strip`)
setup-podman:
	@command -v podman >/dev/null && command -v runc >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends podman runc >/dev/null; }
	@# The CDI test's image is one program linked statically: a C compiler with a static libc.
	@echo 'int main(void){return 0;}' | cc -static -x c -o /dev/null - 2>/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null; }

## setup-rust: only what Rust guests and the host need (the wasm32-wasip2 target): all `make
## demo` installs
setup-rust:
	@rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2

## setup-registry: Debian's docker-registry, a real OCI registry on 127.0.0.1 for the OCI tests
## and for `make release` without REGISTRY
setup-registry:
	@command -v docker-registry >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-registry >/dev/null; }

## guests: build every guest component: the Rust workspace (scanners, hooks, test guests) for
## wasm32-wasip2, and the Python, JavaScript and C guests
guests: setup rust-guests
	@$(MAKE) --no-print-directory lang-guests

## rust-guests: the Rust guest workspace only (what `make demo` serves)
rust-guests: setup-rust
	$(GUEST_CARGO)

lang-guests: $(LANG_GUESTS)

# A guest is rebuilt when its sources or its toolchain change.
.SECONDEXPANSION:
target/guests/python/%.wasm: $$(wildcard guest-scanners/python/$$*/*.py) $(PY_TOOLCHAIN)
	scripts/build-lang-guest.sh python $*
target/guests/js/%.wasm: $$(wildcard guest-scanners/js/$$*/*.js) $(JS_TOOLCHAIN)
	scripts/build-lang-guest.sh js $*
target/guests/c/%.wasm: $$(wildcard guest-scanners/c/$$*/*.[ch]) $(C_TOOLCHAIN)
	scripts/build-lang-guest.sh c $*

## wit-package: the contract `wdp:device-plugin` encoded as a WIT package (wasm-tools, installed by
## `make setup`), for `wkg publish` to a registry (docs/src/authors/shipping.md)
wit-package: $(WIT_PACKAGE)
$(WIT_PACKAGE): wit/device-plugin.wit scripts/setup-toolchains.sh
	@mkdir -p $(dir $@)
	$(TOOLS)/bin/wasm-tools component wit wit --wasm -o $@

## image: the shipped image, `localhost/wdp:$(VERSION)`: the release binary and the bundled Rust
## scanners on `FROM scratch` with the libraries the binary links (scripts/image.sh stages them
## under target/image/ and runs podman build; docs/src/operator/install.md). Tagged with the version only:
## a tag is never moved (no `latest`), so the DaemonSet rolls when, and only when, the version in
## Cargo.toml changes (docs/src/versioning.md).
VERSION := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' Cargo.toml | head -n 1)
image: rust-guests setup-podman
	$(CARGO) build --locked --release -p wdp --bin wdp
	scripts/image.sh --binary target/release/wdp --tag localhost/wdp:$(VERSION)

## release: dist/ for version $(VERSION) (scripts/release.sh lists what it holds): the image as an
## OCI archive, the bundled scanners as OCI artifacts signed in wdp's cosign format (pushed with
## `wdp push` to REGISTRY, else packed as OCI image layouts), the binary's SBOM (cargo-cyclonedx,
## installed under $(TOOLS) the first time), deploy/ with the image pinned, SHA256SUMS.
##   SIGN_KEY=FILE        required: an unencrypted PKCS#8 P-256 key (docs/src/authors/shipping.md)
##   REGISTRY=host[/path] push the image (REGISTRY/wdp:VERSION) and scanners there;
##                        REGISTRY_INSECURE=1 speaks plain HTTP to it (local registries only)
##   RELEASE_BINARY=target/debug/wdp  pack the dev build instead of the release build (a trial
##                        run: the release build is 15-20 minutes of thin LTO on two cores)
RELEASE_BINARY ?= target/release/wdp
CARGO_CYCLONEDX_VERSION := 0.5.9
release: rust-guests setup-podman setup-registry
	@[ -n "$(SIGN_KEY)" ] || { echo "make release: SIGN_KEY=FILE is required (make one: openssl ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8 -nocrypt -out release.pem)" >&2; exit 1; }
	$(if $(filter target/release/wdp,$(RELEASE_BINARY)),$(CARGO) build --locked --release -p wdp --bin wdp)
	$(if $(filter target/debug/wdp,$(RELEASE_BINARY)),$(CARGO) build --locked -p wdp --bin wdp)
	@[ -x $(TOOLS)/bin/cargo-cyclonedx ] || CARGO_PROFILE_DEV_DEBUG=0 $(CARGO) install --quiet --locked --debug --root $(TOOLS) cargo-cyclonedx --version $(CARGO_CYCLONEDX_VERSION)
	CARGO_CYCLONEDX=$(TOOLS)/bin/cargo-cyclonedx scripts/release.sh --binary $(RELEASE_BINARY) --key $(SIGN_KEY) $(if $(REGISTRY),--registry $(REGISTRY)) $(if $(REGISTRY_INSECURE),--insecure)

## e2e: the real-cluster suite (tests/e2e/run.sh, docs/src/contributing/e2e.md): the image
## scripts/image.sh builds from target/debug/wdp, and deploy/ with and without deploy/dra/, in a
## single-node cluster on 127.0.0.1 of the kubelet, kube-apiserver, kube-scheduler,
## kube-controller-manager and kubectl in KUBE_BIN_DIR, with Debian's etcd, containerd and runc
## (installed if missing). Runs as root; without KUBE_BIN_DIR it says what it needs and skips.
KUBE_BIN_DIR ?=
e2e:
	@if [ -z "$(KUBE_BIN_DIR)" ]; then tests/e2e/run.sh; else \
		$(MAKE) --no-print-directory rust-guests wdp setup-podman && KUBE_BIN_DIR="$(KUBE_BIN_DIR)" tests/e2e/run.sh; fi

## host: build the wdp binary and the test targets in one go (dev profile, with an optimised
## wasm compiler): one feature resolution for both, so `make test` never compiles wasmtime twice
host:
	$(CARGO) build --locked --workspace --all-targets

build: guests wit-package host

## wdp: the wdp binary alone (dev profile), what `make demo` runs. Its dependencies carry the
## features the test targets add, and proc-macros the test targets' debug info (Cargo.toml: beside
## tokio, and `[profile.dev.build-override]`), so the `make host` after it reuses every unit.
wdp:
	$(CARGO) build --locked -p wdp --bin wdp

## lint: formatting and clippy, host and guest workspaces
lint: setup
	$(CARGO) fmt --all --check
	cd guest-scanners && $(CARGO) fmt --all --check
	$(CARGO) clippy --locked --workspace --all-targets -- -D warnings
	$(CARGO) clippy --locked --manifest-path $(GUEST_MANIFEST) --target wasm32-wasip2 --target-dir $(GUEST_TARGET_DIR) -- -D warnings

## proto: rewrite crates/kubelet/src/v1beta1.rs from proto/deviceplugin.proto and the generated
## files of crates/dra/src/proto/ from proto/dra (after changing a proto or upgrading prost/tonic;
## `make test` fails while a checked-in file is stale)
proto:
	WDP_WRITE_GENERATED=1 $(CARGO) test --locked -p wdp-tests --test integration -- proto::
	WDP_WRITE_GENERATED=1 $(CARGO) test --locked -p wdp-dra --lib proto

## test: everything CI runs (the book too: tests/tests/book.rs checks its links and its reference
## pages, and mdbook must build it)
test: build lint test-lang-units book
	$(CARGO) test --locked --manifest-path $(GUEST_MANIFEST) --target-dir $(GUEST_TARGET_DIR)
	$(CARGO) test --locked --workspace

## test-lang-units: the Python, JavaScript and C guests' own unit tests, on the build machine
## (their logic, without the host; tests/tests/languages.rs runs the components themselves)
test-lang-units:
	PYTHONDONTWRITEBYTECODE=1 python3 -m unittest discover -s guest-scanners/python/hidraw -p 'test_*.py'
	node --test --test-reporter=spec guest-scanners/js/
	@mkdir -p target/guests/c
	cc -std=c11 -Wall -Wextra -Werror -o target/guests/c/test_v4l_logic guest-scanners/c/v4l/test_v4l_logic.c guest-scanners/c/v4l/v4l_logic.c
	target/guests/c/test_v4l_logic

## book: the book under docs/ (docs/book.toml, docs/src/) built into target/book by mdbook,
## installed from crates.io under $(TOOLS) the first time, pinned, as a debug build without its
## `serve` and `watch` features (their web server is most of a release build's minutes; building
## this book takes a debug mdbook about a second of CPU)
MDBOOK_VERSION := 0.5.4
book:
	@$(TOOLS)/bin/mdbook --version 2>/dev/null | grep -qx 'mdbook v$(MDBOOK_VERSION)' || CARGO_PROFILE_DEV_DEBUG=0 $(CARGO) install --quiet --locked --debug --no-default-features --features search --root $(TOOLS) mdbook --version $(MDBOOK_VERSION)
	$(TOOLS)/bin/mdbook build docs

## fuzz: the property tests behind the fuzzing claims, with many more cases than `make test`
## (FUZZ_CASES, default 50000; FUZZ_SEED picks another fixed seed)
FUZZ_CASES ?= 50000
fuzz:
	WDP_FUZZ_CASES=$(FUZZ_CASES) $(if $(FUZZ_SEED),WDP_FUZZ_SEED=$(FUZZ_SEED)) $(CARGO) test --locked -p wdp --lib fuzz

## demo: serve this machine's real /sys and /dev to an embedded kubelet stand-in (the bundled
## Rust scanners: no other toolchain is installed for it); builds only the binary and the guests.
## It checks its prerequisites first (scripts/prerequisites.sh names what to install), and
## prints what is served once wdp is ready.
demo:
	@scripts/prerequisites.sh
	@$(MAKE) --no-print-directory rust-guests wdp
	DEMO_DURATION=$(DEMO_DURATION) scripts/demo.sh $(WDP) demo/wdp.yaml

## bench: every benchmark figure on this machine (hot-plug latency against a poll-mode baseline,
## Allocate, kubelet restart, start-up, idle memory and wake-ups, 10,000 devices, wasm vs native,
## a peer built on k8s-device-plugin-lib beside wdp) and the criterion micro-benchmarks; writes
## bench/RESULTS.md. Runs as root (fixture device nodes are made with mknod). Builds with the `perf` profile (release without LTO: see
## bench/NOTES.md); the guests are built by the host build (tests/build.rs), in its parallelism.
## The idle row measures the shipped build, target/release/wdp, when it is built from the current
## sources (`make image` builds it; `make bench` does not: 15-20 minutes of thin LTO on two cores,
## more than the whole run), and says which build it measured.
## BENCH_ARGS=--quick for a smoke run, BENCH_ARGS="--only hotplug,poll" for rows.
BENCH_ARGS ?=
# The peer of the `peer` rows: a plugin on crates.io's k8s-device-plugin-lib 0.2.0, in a workspace
# of its own (no other target builds it). The crate declares rust-version 1.98 and builds on 1.95.
PEER_MANIFEST := bench/peer/Cargo.toml
bench:
	@rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2
	@mkdir -p target/perf
	@start=$$(date +%s); \
	$(CARGO) build --locked --profile perf -p wdp -p wdp-bench --bin wdp --bin wdp-bench --bench micro && \
	$(CARGO) build --manifest-path $(GUEST_MANIFEST) --release --locked --target-dir $(GUEST_TARGET_DIR) -p generic-native && \
	$(CARGO) build --manifest-path $(PEER_MANIFEST) --locked --profile perf --ignore-rust-version --target-dir target/peer && \
	echo $$(( $$(date +%s) - start )) > target/perf/bench-build-seconds
	CARGO=$(CARGO) target/perf/wdp-bench --criterion target/criterion --build-seconds $$(cat target/perf/bench-build-seconds) $(BENCH_ARGS)

## soak: SOAK_RESTARTS (200) kubelet restarts, a graceful stop and a crash in turn, with pods
## admitted, their containers restarted from the stand-in's checkpoint (CDI names resolved in the
## spec directory) and a ListAndWatch stream cut between them; then SOAK_DRA_CYCLES (200) DRA
## cycles, each a wdp restart (SIGTERM and SIGKILL in turn) and a DRA kubelet restart with claims
## prepared, prepared again and unprepared between them; writes both reports into
## bench/RESULTS.md. `make test` runs the same tests with 20 restarts and 3 cycles. One at a time:
## each has both cores to itself, and each writes the file alone.
SOAK_RESTARTS ?= 200
SOAK_DRA_CYCLES ?= 200
soak: rust-guests host
	WDP_SOAK_RESTARTS=$(SOAK_RESTARTS) WDP_SOAK_DRA_CYCLES=$(SOAK_DRA_CYCLES) WDP_SOAK_RESULTS=$(CURDIR)/bench/RESULTS.md $(CARGO) test --locked -p wdp-tests --test integration -- soak:: --nocapture --test-threads 1

## audit: Cargo.lock against the RustSec advisory database (cargo-audit, installed from crates.io
## the first time). Needs to reach github.com/rustsec/advisory-db, so it is not part of `make test`.
CARGO_AUDIT_VERSION ?= 0.22.2
audit:
	@command -v cargo-audit >/dev/null || $(CARGO) install --locked cargo-audit --version $(CARGO_AUDIT_VERSION)
	$(CARGO) audit
	$(CARGO) audit --file guest-scanners/Cargo.lock

clean:
	$(CARGO) clean
