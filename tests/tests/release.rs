//! Releases (`make release`, scripts/release.sh, docs/src/versioning.md), checked where it is cheap:
//!
//! * the version is stated once: CHANGELOG.md's newest release and deploy/'s image tag are the
//!   workspace version;
//! * nothing names a moving tag: the image is tagged with the version only, and deploy/ (with
//!   DRA mode's Component) pins every container to it, under the name an overlay's `images:`
//!   entry uses;
//! * a release's deploy/ (scripts/pin-deploy.sh) renders, with and without DRA mode, to deploy/
//!   with every container on the release's image;
//! * the scanners of a release are OCI image layouts of the artifacts `wdp push` made, each with
//!   a cosign-format signature by the release key over its digest: scripts/release-scanners.sh is
//!   run on the test build (it pushes to a throwaway docker-registry of its own) and its output is
//!   checked blob by blob, against the built guests and the key's public half;
//! * given a registry, the script pushes and signs there instead: each listed reference pulls the
//!   built scanner and passes the verification `wdp run` makes under `verify-key`; releasing the
//!   same version there again is refused before anything is pushed.
//!
//! The image archive, the SBOM and the checksums are plain tool runs (`podman save`,
//! cargo-cyclonedx, sha256sum) that `make release RELEASE_BINARY=target/debug/wdp` exercises.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::api::apps::v1::DaemonSet;
use p256::ecdsa::signature::Verifier;
use p256::ecdsa::{Signature, SigningKey};
use p256::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};
use serde_json::Value;
use wdp_oci::artifact;
use wdp_oci::sign::{PAYLOAD_MEDIA_TYPE, SIGNATURE_ANNOTATION};
use wdp_tests::registry::TestRegistry;
use wdp_tests::{repo, wdp_bin};

use crate::deploy::{Doc, all, render, render_with_component, rendered, rendered_dra, split_image};

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn read(rel: &str) -> String {
    let path = repo().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The version headings of a Keep a Changelog file (`## [1.2.3] - 2026-01-01`), in order.
fn changelog_versions(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("## ["))
        .filter_map(|l| l.split_once(']'))
        .map(|(v, _)| v.to_string())
        .collect()
}

#[test]
fn the_changelog_names_this_version_as_its_newest_release() {
    let changelog = read("CHANGELOG.md");
    let versions = changelog_versions(&changelog);
    let released: Vec<&String> = versions.iter().filter(|v| *v != "Unreleased").collect();
    assert_eq!(
        released.first().map(|v| v.as_str()),
        Some(VERSION),
        "CHANGELOG.md's newest release is not the workspace version (Cargo.toml): {versions:?}"
    );
    // "Unreleased", when there, is above every release.
    if let Some(at) = versions.iter().position(|v| v == "Unreleased") {
        assert_eq!(at, 0, "## [Unreleased] must come first: {versions:?}");
    }
    // Every heading's version has its link at the bottom, as Keep a Changelog writes them.
    for v in &versions {
        assert!(
            changelog.contains(&format!("\n[{v}]: ")),
            "CHANGELOG.md: no link for [{v}]"
        );
    }
    let unique: BTreeSet<&String> = versions.iter().collect();
    assert_eq!(
        unique.len(),
        versions.len(),
        "a version twice: {versions:?}"
    );
}

/// Every container image of a rendering, by object.
fn images(docs: &[Doc]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for ds in all::<DaemonSet>(docs) {
        let name = ds.metadata.name.clone().unwrap_or_default();
        let spec = ds.spec.template.spec.expect("a pod spec");
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            let policy = c.image_pull_policy.clone().unwrap_or_default();
            assert_ne!(
                policy, "Always",
                "{name}/{}: an immutable tag needs no Always",
                c.name
            );
            out.push((
                format!("{name}/{}", c.name),
                c.image.clone().unwrap_or_default(),
            ));
        }
    }
    out
}

#[test]
fn deploy_pins_this_version_under_the_name_overlays_use() {
    for (what, docs) in [
        ("deploy/", rendered()),
        ("deploy/ with dra/", rendered_dra()),
    ] {
        let images = images(&docs);
        assert!(!images.is_empty(), "{what}: no container");
        for (container, image) in images {
            let (name, tag) = split_image(&image);
            // The version, never a moving tag: a new version is a new pod template.
            assert_eq!(tag, Some(VERSION), "{what} {container}: {image}");
            // The name the DaemonSet uses, unrenamed: an overlay's `images: [{name: wdp, ...}]`
            // finds it (a base that renamed it would make every overlay name the base's choice).
            assert_eq!(name, "wdp", "{what} {container}: {image}");
        }
    }
}

#[test]
fn a_releases_deploy_installs_its_image() {
    let dir = tempfile::tempdir().unwrap();
    let pinned = dir.path().join("deploy");
    let image = "registry.example/team/wdp";
    let run = Command::new(repo().join("scripts/pin-deploy.sh"))
        .arg(&pinned)
        .args([image, "9.8.7"])
        .output()
        .expect("run scripts/pin-deploy.sh");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let base = render(&pinned).unwrap_or_else(|e| panic!("the pinned deploy/: {e}"));
    let dra = render_with_component(&pinned, &pinned.join("dra"))
        .unwrap_or_else(|e| panic!("the pinned deploy/ with dra/: {e}"));
    for (what, docs) in [("deploy/", &base), ("deploy/ with dra/", &dra)] {
        let images = images(docs);
        assert!(!images.is_empty(), "{what}: no container");
        for (container, pinned_image) in images {
            assert_eq!(pinned_image, format!("{image}:9.8.7"), "{what} {container}");
        }
    }
    // Everything else is deploy/ as it is.
    let strip = |docs: Vec<Doc>| -> Vec<serde_json::Value> {
        docs.into_iter()
            .map(|mut d| {
                if let Some(Value::Array(cs)) =
                    d.value.pointer_mut("/spec/template/spec/containers")
                {
                    for c in cs {
                        c["image"] = Value::Null;
                    }
                }
                d.value
            })
            .collect()
    };
    assert_eq!(strip(base), strip(rendered()));
    assert_eq!(strip(dra), strip(rendered_dra()));
}

#[test]
fn the_image_is_tagged_with_the_version_only() {
    for file in ["Makefile", "scripts/image.sh", "scripts/release.sh"] {
        let text = read(file);
        assert!(
            !text.contains(":latest"),
            "{file} names a `latest` tag: tags are versions, never moved"
        );
    }
    assert!(read("Makefile").contains("--tag localhost/wdp:$(VERSION)\n"));
    assert!(read("scripts/image.sh").contains("tags=\"localhost/wdp:$version\""));
}

/// A registry `docker-registry` can be started here: the script needs it for its layouts.
fn has_docker_registry() -> bool {
    Command::new("sh")
        .args(["-c", "command -v docker-registry"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `sha256:<hex>` of `bytes`.
fn digest(bytes: &[u8]) -> String {
    wdp_oci::sha256_digest(bytes)
}

/// The blob `digest` of an OCI layout, checked against its name.
fn blob(layout: &Path, digest_: &str) -> Vec<u8> {
    let hex = digest_.strip_prefix("sha256:").expect("a sha256 digest");
    let path = layout.join("blobs/sha256").join(hex);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        digest(&bytes),
        digest_,
        "{} holds other bytes",
        path.display()
    );
    bytes
}

/// The release key of these tests, written as `make release` takes it.
fn release_key(dir: &Path) -> (SigningKey, std::path::PathBuf) {
    let key = SigningKey::from_slice(&[0x5a; 32]).unwrap();
    let pem = dir.join("release.pem");
    std::fs::write(&pem, key.to_pkcs8_pem(LineEnding::LF).unwrap().as_bytes()).unwrap();
    (key, pem)
}

/// Runs scripts/release-scanners.sh into `out` with `more` arguments; its scanners.txt, checked
/// to list every bundled scanner (the image's list) pinned by digest: name -> reference.
fn release_scanners(pem: &Path, out: &Path, more: &[&str]) -> BTreeMap<String, String> {
    let run = Command::new(repo().join("scripts/release-scanners.sh"))
        .arg("--wdp")
        .arg(wdp_bin())
        .arg("--key")
        .arg(pem)
        .arg("--out")
        .arg(out)
        .args(more)
        .output()
        .expect("run scripts/release-scanners.sh");
    assert!(
        run.status.success(),
        "scripts/release-scanners.sh: {}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let listed: BTreeMap<String, String> = std::fs::read_to_string(out.join("scanners.txt"))
        .unwrap()
        .lines()
        .map(|l| {
            let (name, reference) = l.split_once(' ').expect("<name> <reference>");
            (name.to_string(), reference.to_string())
        })
        .collect();
    let bundled: BTreeSet<String> = read("scripts/image.sh")
        .lines()
        .find_map(|l| l.strip_prefix("scanners=\""))
        .and_then(|l| l.strip_suffix('"'))
        .expect("scripts/image.sh: scanners=\"...\"")
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!(listed.keys().cloned().collect::<BTreeSet<_>>(), bundled);
    listed
}

#[test]
fn release_scanners_are_signed_oci_layouts_of_the_pushed_artifacts() {
    assert!(
        has_docker_registry(),
        "docker-registry is not installed: `make setup` installs it (Debian package docker-registry)"
    );
    let dir = tempfile::tempdir().unwrap();
    let (key, pem) = release_key(dir.path());
    let out = dir.path().join("dist");
    let listed = release_scanners(&pem, &out, &[]);

    for (name, reference) in &listed {
        let (repository, manifest_digest) = reference.split_once('@').expect("pinned by digest");
        assert_eq!(repository, format!("scanners/{name}"));
        let layout = out.join("scanners").join(name);
        let oci_layout: Value =
            serde_json::from_slice(&std::fs::read(layout.join("oci-layout")).unwrap()).unwrap();
        assert_eq!(oci_layout["imageLayoutVersion"], "1.0.0");
        let index: Value =
            serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
        let refs: BTreeMap<String, Value> = index["manifests"]
            .as_array()
            .expect("index.json lists manifests")
            .iter()
            .map(|m| {
                let tag = m["annotations"]["org.opencontainers.image.ref.name"]
                    .as_str()
                    .expect("a ref name")
                    .to_string();
                (tag, m.clone())
            })
            .collect();
        let sig_tag = format!("{}.sig", manifest_digest.replace(':', "-"));
        assert_eq!(
            refs.keys().cloned().collect::<BTreeSet<_>>(),
            BTreeSet::from([VERSION.to_string(), sig_tag.clone()]),
            "{name}: the layout holds the version's tag and its signature"
        );

        // The artifact: the wasm layout, its one layer the built component.
        let artifact_ref = &refs[VERSION];
        assert_eq!(artifact_ref["digest"], *manifest_digest, "{name}");
        let manifest_bytes = blob(&layout, manifest_digest);
        assert_eq!(artifact_ref["size"], manifest_bytes.len(), "{name}");
        let manifest: oci_client::manifest::OciImageManifest =
            serde_json::from_slice(&manifest_bytes).unwrap();
        let config = blob(&layout, &manifest.config.digest);
        let (layer, _) = artifact::check(&manifest, std::str::from_utf8(&config).unwrap())
            .unwrap_or_else(|e| panic!("{name}: not a wasm artifact: {e}"));
        let component = blob(&layout, &layer.digest);
        assert_eq!(
            component,
            std::fs::read(wdp_tests::guest(name)).unwrap(),
            "{name}: the layer is not the built scanner"
        );

        // The signature: cosign's layout, by the release key, over this manifest's digest.
        let sig_manifest: oci_client::manifest::OciImageManifest =
            serde_json::from_slice(&blob(&layout, refs[&sig_tag]["digest"].as_str().unwrap()))
                .unwrap();
        let [payload_layer] = &sig_manifest.layers[..] else {
            panic!("{name}: the signature has one layer")
        };
        assert_eq!(payload_layer.media_type, PAYLOAD_MEDIA_TYPE);
        let payload = blob(&layout, &payload_layer.digest);
        let b64 = payload_layer
            .annotations
            .as_ref()
            .and_then(|a| a.get(SIGNATURE_ANNOTATION))
            .unwrap_or_else(|| panic!("{name}: no {SIGNATURE_ANNOTATION}"));
        let signature = Signature::from_der(&STANDARD.decode(b64).unwrap()).unwrap();
        key.verifying_key()
            .verify(&payload, &signature)
            .unwrap_or_else(|e| panic!("{name}: the signature does not verify: {e}"));
        let payload: Value = serde_json::from_slice(&payload).unwrap();
        assert_eq!(
            payload["critical"]["image"]["docker-manifest-digest"], *manifest_digest,
            "{name}: the signature signs another digest"
        );
    }
}

#[tokio::test]
async fn release_scanners_given_a_registry_are_pushed_and_signed_there() {
    let registry = TestRegistry::start();
    let dir = tempfile::tempdir().unwrap();
    let (key, pem) = release_key(dir.path());
    let public = dir.path().join("cosign.pub");
    std::fs::write(
        &public,
        key.verifying_key()
            .to_public_key_pem(LineEnding::LF)
            .unwrap(),
    )
    .unwrap();
    let public = wdp_oci::sign::PublicKey::from_file(&public).unwrap();
    let out = dir.path().join("dist");
    let prefix = format!("{}/wdp-release", registry.addr);
    let listed = tokio::task::spawn_blocking({
        let (pem, out, prefix) = (pem.clone(), out.clone(), prefix.clone());
        move || release_scanners(&pem, &out, &["--registry", &prefix, "--insecure"])
    })
    .await
    .unwrap();
    // Nothing is packed as a layout when the registry holds the artifacts.
    assert!(!out.join("scanners").exists());
    let client = wdp_oci::Registry::new(wdp_oci::RegistryOptions {
        insecure: vec![registry.addr.clone()],
        username: None,
        password: None,
    });
    for (name, reference) in &listed {
        let (repository, digest_) = reference.split_once('@').expect("pinned by digest");
        assert_eq!(repository, format!("{prefix}/scanners/{name}"));
        // The version's tag and the pinned reference are the same artifact: the built scanner.
        let tagged = client
            .pull(&format!("{repository}:{VERSION}"))
            .await
            .unwrap();
        assert_eq!(tagged.manifest_digest, digest_, "{name}");
        assert_eq!(
            tagged.bytes,
            std::fs::read(wdp_tests::guest(name)).unwrap(),
            "{name}: not the built scanner"
        );
        wdp_oci::sign::verify(&client, reference, digest_, &public)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }

    // The same version again is refused before anything is pushed: its tags are never moved.
    let again = tokio::process::Command::new(repo().join("scripts/release-scanners.sh"))
        .arg("--wdp")
        .arg(wdp_bin())
        .arg("--key")
        .arg(&pem)
        .arg("--out")
        .arg(dir.path().join("again"))
        .args(["--registry", &prefix, "--insecure"])
        .output()
        .await
        .expect("run scripts/release-scanners.sh");
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success(), "a version released twice");
    assert!(err.contains("never moved"), "{err}");
    assert!(
        again.stdout.is_empty(),
        "pushed something: {}",
        String::from_utf8_lossy(&again.stdout)
    );
}
