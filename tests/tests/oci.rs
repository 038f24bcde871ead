//! Scanners as OCI artifacts, against a real registry process (Debian's docker-registry on
//! 127.0.0.1): push, pull by tag and digest, run from `oci://`, and every refusal.

use std::path::{Path, PathBuf};

use p256::ecdsa::SigningKey;
use p256::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};
use wdp_tests::fixture::Fixture;
use wdp_tests::host::{serve, sockets};
use wdp_tests::registry::TestRegistry;
use wdp_tests::{guest, wdp, wdp_run_to_exit};

fn ok(out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "wdp failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn failed(out: std::process::Output) -> String {
    assert!(!out.status.success(), "wdp should have failed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn push(registry: &TestRegistry, file: &Path, repo: &str) -> String {
    let reference = format!("{}/{repo}", registry.addr);
    ok(wdp(&[
        "push",
        &file.display().to_string(),
        &reference,
        "--insecure",
    ]))
}

/// A P-256 key pair written as PEM files; `seed` makes it deterministic.
fn key_pair(dir: &Path, name: &str, seed: u8) -> (PathBuf, PathBuf) {
    let key = SigningKey::from_slice(&[seed; 32]).unwrap();
    let private = dir.join(format!("{name}.pem"));
    let public = dir.join(format!("{name}.pub"));
    std::fs::write(
        &private,
        key.to_pkcs8_pem(LineEnding::LF).unwrap().as_bytes(),
    )
    .unwrap();
    std::fs::write(
        &public,
        key.verifying_key()
            .to_public_key_pem(LineEnding::LF)
            .unwrap(),
    )
    .unwrap();
    (private, public)
}

fn config(f: &Fixture, registry: &TestRegistry, component: &str, extra: &str) -> PathBuf {
    let path = f.path().join("wdp.yaml");
    std::fs::write(
        &path,
        format!(
            "scanners:
  - name: kvm
    component: '{component}'
    namespace: devices.example.com
    env: {{ SLOTS: 1, RESCAN_INTERVAL_MS: 600000 }}
{extra}oci:
  cache-dir: {cache}
  insecure-registries: ['{addr}']
",
            cache = f.path().join("oci-cache").display(),
            addr = registry.addr,
        ),
    )
    .unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_pull_run_and_survive_the_registry_going_down() {
    let mut registry = TestRegistry::start();
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let digest = push(&registry, &guest("kvm"), "scanners/kvm:1.0");
    assert!(digest.starts_with("sha256:"), "{digest}");
    let original = std::fs::read(guest("kvm")).unwrap();

    // Pull by tag and by digest: the very bytes, the same digest.
    for reference in [
        format!("{}/scanners/kvm:1.0", registry.addr),
        format!("oci://{}/scanners/kvm@{digest}", registry.addr),
    ] {
        let out = f.path().join("pulled.wasm");
        let printed = ok(wdp(&[
            "pull",
            &reference,
            "-o",
            &out.display().to_string(),
            "--insecure",
        ]));
        assert!(printed.starts_with(&digest), "{printed}");
        assert_eq!(std::fs::read(&out).unwrap(), original, "{reference}");
    }
    let described = ok(wdp(&[
        "inspect",
        &format!("{}/scanners/kvm:1.0", registry.addr),
        "--insecure",
    ]));
    assert!(described.contains("world:    scanner"), "{described}");
    assert!(
        described.contains("wdp:device-plugin/scanner@0.1.2"),
        "{described}"
    );
    assert!(
        described.contains(&format!("manifest: {digest}")),
        "{described}"
    );

    // Run from the registry by tag; the tag's digest is logged.
    let plugins = f.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let reference = format!("oci://{}/scanners/kvm:1.0", registry.addr);
    let cfg = config(&f, &registry, &reference, "");
    let (kubelet, mut seen, host) = serve(&f, &cfg, &plugins);
    seen.devices("devices.example.com/kvm", &["kvm-0"]).await;
    assert!(host.log().contains(&digest), "{}", host.log());
    assert!(host.terminate().await.success());

    // The registry goes down: a restart serves from the cache.
    registry.stop();
    let host = wdp_tests::host::Host::start(&cfg, &plugins, &f);
    let (kubelet2, seen2) = {
        kubelet.stop().await;
        wdp_kubelet::standin::StandIn::start(&plugins).unwrap()
    };
    wdp_tests::host::Seen::new(seen2)
        .devices("devices.example.com/kvm", &["kvm-0"])
        .await;
    assert!(
        host.log()
            .contains("registry unreachable; using the cached component"),
        "{}",
        host.log()
    );
    assert!(host.terminate().await.success());
    kubelet2.stop().await;
    // wdp removed its sockets; kubelet's stays behind, as a real kubelet leaves it.
    assert_eq!(sockets(&plugins), ["kubelet.sock"]);
}

#[test]
fn tampered_wrong_digest_and_wrong_world_are_refused() {
    let registry = TestRegistry::start();
    let f = Fixture::new();

    // A tampered blob: one byte flipped in the registry's storage.
    push(&registry, &guest("kvm"), "scanners/tampered:1");
    let layer = wdp_tests::registry::sha256_file(&guest("kvm"));
    let blob = registry.blob_path(&layer);
    let mut bytes = std::fs::read(&blob).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&blob, bytes).unwrap();
    let tampered = format!("oci://{}/scanners/tampered:1", registry.addr);
    let err = failed(wdp(&["pull", &tampered, "--insecure", "-o", "/dev/null"]));
    assert!(err.contains("does not match its digest"), "{err}");
    let err = failed(wdp_run_to_exit(&f, &config(&f, &registry, &tampered, "")));
    assert!(
        err.contains("scanner kvm") && err.contains("does not match its digest"),
        "{err}"
    );

    // A digest that is not the artifact's.
    let wrong = format!(
        "oci://{}/scanners/tampered@sha256:{}",
        registry.addr,
        "0".repeat(64)
    );
    let err = failed(wdp_run_to_exit(&f, &config(&f, &registry, &wrong, "")));
    assert!(
        err.contains("scanner kvm") && err.contains(&"0".repeat(64)),
        "{err}"
    );

    // A hook pushed where a scanner is expected: refused from its declared world, before compiling.
    push(&registry, &guest("test_hooks"), "scanners/hooks:1");
    let hooks = format!("oci://{}/scanners/hooks:1", registry.addr);
    let err = failed(wdp_run_to_exit(&f, &config(&f, &registry, &hooks, "")));
    assert!(
        err.contains("world is not one this host runs")
            && err.contains("wdp:device-plugin/scanner@0.1.2"),
        "{err}"
    );

    // Digests required, but a tag given.
    let cfg = config(&f, &registry, &hooks, "");
    let text = std::fs::read_to_string(&cfg).unwrap() + "  require-digest: true\n";
    std::fs::write(&cfg, text).unwrap();
    let err = failed(wdp_run_to_exit(&f, &cfg));
    assert!(err.contains("has no digest"), "{err}");
    assert!(sockets(&f.path().join("plugins")).is_empty());
}

/// What is not a wasm component is refused with what it is: a container image where a scanner
/// was expected (pull and run), a core module at push and inspect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_images_and_core_modules_are_not_components() {
    use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};

    let registry = TestRegistry::start();
    let f = Fixture::new();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = oci_client::Client::new(ClientConfig {
        protocol: ClientProtocol::HttpsExcept(vec![registry.addr.clone()]),
        ..Default::default()
    });
    let image = format!("{}/images/busybox:1", registry.addr);
    client
        .push(
            &image.parse().unwrap(),
            &[ImageLayer::oci_v1(b"a layer".to_vec(), None)],
            Config::oci_v1(br#"{"architecture":"amd64","os":"linux"}"#.to_vec(), None),
            &oci_client::secrets::RegistryAuth::Anonymous,
            None,
        )
        .await
        .unwrap();
    let image = format!("oci://{image}");
    let err = failed(wdp(&["pull", &image, "--insecure", "-o", "/dev/null"]));
    assert!(
        err.contains("not a wasm component artifact")
            && err.contains("application/vnd.oci.image.config.v1+json")
            && err.contains("application/vnd.wasm.config.v0+json"),
        "{err}"
    );
    let err = failed(wdp_run_to_exit(&f, &config(&f, &registry, &image, "")));
    assert!(
        err.contains("scanner kvm") && err.contains("not a wasm component artifact"),
        "{err}"
    );

    let core = f.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    let core = core.display().to_string();
    let pushed = format!("{}/scanners/core:1", registry.addr);
    for err in [
        failed(wdp(&["push", &core, &pushed, "--insecure"])),
        failed(wdp(&["inspect", &core])),
    ] {
        assert!(
            err.contains(&core)
                && err.contains("core wasm module")
                && err.contains("wasm32-wasip2"),
            "{err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signatures_are_required_when_a_key_is_configured() {
    let registry = TestRegistry::start();
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let (private, public) = key_pair(f.path(), "team", 7);
    let (other_private, _) = key_pair(f.path(), "other", 9);
    push(&registry, &guest("kvm"), "scanners/kvm:signed");
    let reference = format!("oci://{}/scanners/kvm:signed", registry.addr);
    let verify = format!("    verify-key: {}\n", public.display());

    // Unsigned: refused, nothing runs.
    let cfg = config(&f, &registry, &reference, &verify);
    let err = failed(wdp_run_to_exit(&f, &cfg));
    assert!(
        err.contains("signature check failed") && err.contains("no signature"),
        "{err}"
    );

    // Signed with another key: refused.
    let sign = |key: &Path| {
        ok(wdp(&[
            "sign",
            &reference,
            "--key",
            &key.display().to_string(),
            "--insecure",
        ]))
    };
    let sig = sign(&other_private);
    assert!(sig.ends_with(".sig"), "{sig}");
    let err = failed(wdp_run_to_exit(&f, &cfg));
    assert!(
        err.contains("does not verify with the configured key"),
        "{err}"
    );

    // Signed with the configured key: it runs.
    sign(&private);
    let plugins = f.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let (kubelet, mut seen, host) = serve(&f, &cfg, &plugins);
    seen.devices("devices.example.com/kvm", &["kvm-0"]).await;
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

/// Credentials: from flags, from the environment, and from the docker config file.
#[test]
fn registry_credentials_from_flags_env_and_docker_config() {
    // bcrypt (cost 4) of "s3cret"
    let hash = "$2b$04$pXsOZ5fyLW1/c397/7qSmO//8M0SwQXdxjQiDrilxrPOmOiiYqxC6";
    let registry = TestRegistry::start_with_auth("ci", hash);
    let f = Fixture::new();
    let reference = format!("{}/scanners/kvm:auth", registry.addr);
    let kvm = guest("kvm").display().to_string();
    let wdp_with = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = std::process::Command::new(wdp_tests::wdp_bin());
        cmd.args(args)
            .env("RUST_LOG", "warn")
            .env("DOCKER_CONFIG", f.path().join("no-docker-config"))
            .env_remove("WDP_REGISTRY_USERNAME")
            .env_remove("WDP_REGISTRY_PASSWORD");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().expect("run wdp")
    };

    // Anonymous: refused, and the message says so.
    let err = failed(wdp_with(&["push", &kvm, &reference, "--insecure"], &[]));
    assert!(err.contains("wants credentials"), "{err}");
    let err = failed(wdp_with(
        &[
            "push",
            &kvm,
            &reference,
            "--insecure",
            "--username",
            "ci",
            "--password",
            "wrong",
        ],
        &[],
    ));
    assert!(
        err.contains(&reference) && err.contains("wants credentials"),
        "{err}"
    );

    // Flags.
    let digest = ok(wdp_with(
        &[
            "push",
            &kvm,
            &reference,
            "--insecure",
            "--username",
            "ci",
            "--password",
            "s3cret",
        ],
        &[],
    ));
    assert!(digest.starts_with("sha256:"), "{digest}");

    // Environment.
    let out = f.path().join("env.wasm");
    ok(wdp_with(
        &[
            "pull",
            &reference,
            "--insecure",
            "-o",
            &out.display().to_string(),
        ],
        &[
            ("WDP_REGISTRY_USERNAME", "ci"),
            ("WDP_REGISTRY_PASSWORD", "s3cret"),
        ],
    ));
    assert_eq!(
        std::fs::read(&out).unwrap(),
        std::fs::read(guest("kvm")).unwrap()
    );

    // The docker config file ($DOCKER_CONFIG/config.json).
    let docker = f.path().join("docker");
    std::fs::create_dir_all(&docker).unwrap();
    use base64::Engine;
    let token = base64::engine::general_purpose::STANDARD.encode("ci:s3cret");
    std::fs::write(
        docker.join("config.json"),
        format!(
            r#"{{"auths": {{"{}": {{"auth": "{token}"}}}}}}"#,
            registry.addr
        ),
    )
    .unwrap();
    let out = f.path().join("docker.wasm");
    let docker = docker.display().to_string();
    ok(wdp_with(
        &[
            "pull",
            &reference,
            "--insecure",
            "-o",
            &out.display().to_string(),
        ],
        &[("DOCKER_CONFIG", &docker)],
    ));
    assert_eq!(
        std::fs::read(&out).unwrap(),
        std::fs::read(guest("kvm")).unwrap()
    );
}
