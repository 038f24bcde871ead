//! The Wasm OCI artifact layout (CNCF TAG-Runtime, the one `wkg`, `wasm-pkg-tools` and
//! `oci-wasm` write): a manifest with one `application/wasm` layer and a config of type
//! `application/vnd.wasm.config.v0+json` that names the component's imports and exports, so a
//! puller can judge a component's world before it fetches or compiles it. [`Package`] assembles
//! it for a push; [`check`] holds a pulled manifest to it before any layer is fetched.
//!
//! Written here rather than taken from `oci-wasm`, whose config it reproduces field for field:
//! that crate reads a component's world with `wit-component` 0.253, a second copy of the wasm
//! toolchain beside wasmtime's 0.254 (a tenth of the host's build time, bench/NOTES.md). The names
//! it lists are the component's top-level import and export names, which `wasmparser` (linked
//! for wasmtime already) reads directly.

use std::time::SystemTime;

use oci_client::client::{Config, ImageLayer};
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use serde::{Deserialize, Serialize};
use wasmparser::{Encoding, Parser, Payload};

/// The manifest's media type.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// The config's media type.
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The one layer's media type: the component itself.
pub const LAYER_MEDIA_TYPE: &str = "application/wasm";

/// The artifact config.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WasmConfig {
    /// When the artifact was made (RFC 3339). Kept as text: nothing here depends on it.
    pub created: String,
    /// Who made it, when the pushing tool recorded it.
    #[serde(default)]
    pub author: Option<String>,
    /// Always `wasm`.
    pub architecture: String,
    /// `wasip2` for a component (`wasip1` for a core module, which wdp does not run).
    pub os: String,
    /// The manifest's layer digests, in order: they make each config, and so each artifact
    /// id, unique.
    pub layer_digests: Vec<String>,
    /// The component's world; required for `wasip2`.
    #[serde(default)]
    pub component: Option<ComponentWorld>,
}

/// What a component imports and exports, by the names in its binary (`wasi:io/poll@0.2.6`,
/// `wdp:device-plugin/scanner@0.1.0`, or a plain name for a function).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentWorld {
    /// What the component provides (for a scanner, its `scanner` interface).
    pub exports: Vec<String>,
    /// What the component needs from the host: checked against what the host offers.
    pub imports: Vec<String>,
    /// The WIT world it targets, when a tool recorded one (for indexes; not read here).
    #[serde(default)]
    pub target: Option<String>,
}

/// Why bytes cannot be described as a component.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// A core module: the host runs components only.
    #[error(
        "a core wasm module, not a component ({})",
        crate::contract::CORE_MODULE_REMEDY
    )]
    CoreModule,
    /// Not a wasm binary the parser can read.
    #[error("not a wasm binary: {0}")]
    Malformed(#[from] wasmparser::BinaryReaderError),
}

/// Why a pulled manifest is not a wasm component artifact.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// The manifest's own media type (an image index, say).
    #[error("manifest media type {0:?}, not {MANIFEST_MEDIA_TYPE}")]
    ManifestType(String),
    /// The config blob's media type (a container image's, say).
    #[error("config media type {0:?}, not {CONFIG_MEDIA_TYPE}")]
    ConfigType(String),
    /// The number of layers: the layout has exactly one.
    #[error("{0} layers, not one")]
    Layers(usize),
    /// The layer's media type.
    #[error("layer media type {0:?}, not {LAYER_MEDIA_TYPE}")]
    LayerType(String),
    /// The config blob does not parse as a [`WasmConfig`].
    #[error("its config is not a wasm config: {0}")]
    Config(serde_json::Error),
    /// The config does not name the layer it describes.
    #[error("the config's layerDigests do not list the layer")]
    UnlistedLayer,
}

/// What a push sends: the component as the one layer, its config, and the manifest naming both.
pub struct Package {
    /// The one layer: the component's bytes.
    pub layers: Vec<ImageLayer>,
    /// The [`WasmConfig`] as a blob.
    pub config: Config,
    /// The manifest naming the two.
    pub manifest: OciImageManifest,
}

impl Package {
    /// Packages `component`.
    pub fn of(component: Vec<u8>) -> Result<Self, ArtifactError> {
        let config = WasmConfig::for_component(&component, super::sha256_digest(&component))?;
        let config = Config::new(
            serde_json::to_vec(&config).expect("a config of strings serialises"),
            CONFIG_MEDIA_TYPE.into(),
            None,
        );
        let layers = vec![ImageLayer::new(component, LAYER_MEDIA_TYPE.into(), None)];
        let mut manifest = OciImageManifest::build(&layers, &config, None);
        manifest.media_type = Some(MANIFEST_MEDIA_TYPE.into());
        Ok(Package {
            layers,
            config,
            manifest,
        })
    }
}

/// Checks a pulled manifest and its config (the text the registry served) against the layout,
/// before any layer is fetched. Returns the component's layer and the config.
pub fn check<'m>(
    manifest: &'m OciImageManifest,
    config: &str,
) -> Result<(&'m OciDescriptor, WasmConfig), LayoutError> {
    if let Some(other) = manifest
        .media_type
        .as_deref()
        .filter(|m| *m != MANIFEST_MEDIA_TYPE)
    {
        return Err(LayoutError::ManifestType(other.into()));
    }
    if manifest.config.media_type != CONFIG_MEDIA_TYPE {
        return Err(LayoutError::ConfigType(manifest.config.media_type.clone()));
    }
    let [layer] = manifest.layers.as_slice() else {
        return Err(LayoutError::Layers(manifest.layers.len()));
    };
    if layer.media_type != LAYER_MEDIA_TYPE {
        return Err(LayoutError::LayerType(layer.media_type.clone()));
    }
    let config: WasmConfig = serde_json::from_str(config).map_err(LayoutError::Config)?;
    if !config.layer_digests.contains(&layer.digest) {
        return Err(LayoutError::UnlistedLayer);
    }
    Ok((layer, config))
}

impl ComponentWorld {
    /// Reads the top-level imports and exports of a component. Nested modules and components
    /// (an adapter's `wasi_snapshot_preview1` imports, say) are not the component's world and
    /// are skipped.
    pub fn of(bytes: &[u8]) -> Result<Self, ArtifactError> {
        let mut world = ComponentWorld::default();
        // Nesting depth: the parser yields nested modules' and components' payloads inline.
        let mut depth = 0usize;
        for payload in Parser::new(0).parse_all(bytes) {
            match payload? {
                Payload::Version { encoding, .. }
                    if depth == 0 && encoding != Encoding::Component =>
                {
                    return Err(ArtifactError::CoreModule);
                }
                Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
                Payload::End(_) if depth == 0 => break,
                Payload::End(_) => depth -= 1,
                Payload::ComponentImportSection(section) if depth == 0 => {
                    for import in section {
                        world.imports.push(import?.name.name.to_string());
                    }
                }
                Payload::ComponentExportSection(section) if depth == 0 => {
                    for export in section {
                        world.exports.push(export?.name.name.to_string());
                    }
                }
                _ => {}
            }
        }
        Ok(world)
    }
}

impl WasmConfig {
    /// The config of an artifact holding `component`, whose digest is `layer_digest`.
    pub fn for_component(component: &[u8], layer_digest: String) -> Result<Self, ArtifactError> {
        Ok(WasmConfig {
            created: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            author: None,
            architecture: "wasm".into(),
            os: "wasip2".into(),
            layer_digests: vec![layer_digest],
            component: Some(ComponentWorld::of(component)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The binary preamble of a component (`\0asm`, version 0x0d, layer 1).
    const COMPONENT: [u8; 8] = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];
    /// The binary preamble of a core module (`\0asm`, version 1).
    const MODULE: [u8; 8] = [0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00];

    /// A section: id, size, contents.
    fn section(id: u8, contents: &[u8]) -> Vec<u8> {
        let mut out = vec![id, u8::try_from(contents.len()).expect("small")];
        out.extend_from_slice(contents);
        out
    }

    /// The contents of an import section: one import of an instance of type 0, named `name`.
    fn import_instance(name: &str) -> Vec<u8> {
        let mut import = vec![1, 0x00, u8::try_from(name.len()).expect("small")];
        import.extend_from_slice(name.as_bytes());
        import.extend_from_slice(&[0x05, 0x00]); // an instance of type 0
        import
    }

    #[test]
    fn top_level_names_only_nested_ones_skipped() {
        let mut bytes = COMPONENT.to_vec();
        bytes.extend(section(7, &[1, 0x42, 0x00])); // one type: an empty instance type
        bytes.extend(section(10, &import_instance("wasi:io/poll@0.2.6")));
        // A nested core module that imports something of its own.
        let mut module = MODULE.to_vec();
        // Import section: 1 import, module "env", field "f", a function of type 0 — its type
        // section is missing, but the reader never resolves it.
        let mut import = vec![1, 3];
        import.extend_from_slice(b"env");
        import.extend_from_slice(&[1, b'f', 0x00, 0x00]);
        module.extend(section(2, &import));
        bytes.extend(section(1, &module));
        // Export the imported instance (instance index 0) as the world's export.
        let name = "wdp:device-plugin/scanner@0.1.0";
        let mut export = vec![1, 0x00, u8::try_from(name.len()).expect("small")];
        export.extend_from_slice(name.as_bytes());
        export.extend_from_slice(&[0x05, 0x00, 0x00]); // instance 0, no type ascription
        bytes.extend(section(11, &export));

        let world = ComponentWorld::of(&bytes).expect("a component");
        assert_eq!(world.imports, ["wasi:io/poll@0.2.6"]);
        assert_eq!(world.exports, ["wdp:device-plugin/scanner@0.1.0"]);
    }

    #[test]
    fn core_modules_and_garbage_are_refused_with_what_to_do() {
        let err = ComponentWorld::of(&MODULE).expect_err("a core module");
        assert!(err.to_string().contains("wasm32-wasip2"), "{err}");
        let err = ComponentWorld::of(b"#!/bin/sh\n").expect_err("not wasm");
        assert!(err.to_string().starts_with("not a wasm binary"), "{err}");
    }

    #[test]
    fn the_config_reads_what_other_tools_write() {
        // As `oci-wasm` 0.6 writes it (its field names and shapes).
        let text = r#"{"created":"2026-01-02T03:04:05.123456Z","author":null,"architecture":"wasm",
            "os":"wasip2","layerDigests":["sha256:ab"],
            "component":{"exports":["wdp:device-plugin/scanner@0.1.0"],"imports":["wasi:io/poll@0.2.6"],"target":null}}"#;
        let config: WasmConfig = serde_json::from_str(text).expect("parses");
        assert_eq!(config.layer_digests, ["sha256:ab"]);
        let world = config.component.expect("has a world");
        assert_eq!(world.exports, ["wdp:device-plugin/scanner@0.1.0"]);

        let ours = WasmConfig::for_component(&COMPONENT, "sha256:cd".into()).expect("component");
        let json = serde_json::to_value(&ours).expect("serialises");
        for key in ["created", "architecture", "os", "layerDigests", "component"] {
            assert!(json.get(key).is_some(), "{key} missing from {json}");
        }
        assert_eq!(json["os"], "wasip2");
    }

    #[test]
    fn a_package_passes_its_own_check_and_a_changed_one_does_not() {
        let package = Package::of(COMPONENT.to_vec()).expect("packages");
        let listed = String::from_utf8(package.config.data.to_vec()).expect("json");
        let manifest = &package.manifest;
        let (layer, parsed) = check(manifest, &listed).expect("our own layout");
        assert_eq!(layer.media_type, LAYER_MEDIA_TYPE);
        assert_eq!(parsed.layer_digests, std::slice::from_ref(&layer.digest));
        // The digest the manifest gives the layer is what the config must list.
        let unlisted = listed.replace(&layer.digest, "sha256:00");
        assert!(matches!(
            check(manifest, &unlisted),
            Err(LayoutError::UnlistedLayer)
        ));

        let mut other = manifest.clone();
        other.layers[0].media_type = "application/vnd.oci.image.layer.v1.tar+gzip".into();
        let err = check(&other, &listed).expect_err("a container layer");
        assert_eq!(
            err.to_string(),
            "layer media type \"application/vnd.oci.image.layer.v1.tar+gzip\", not application/wasm"
        );
        let mut two = manifest.clone();
        two.layers.push(manifest.layers[0].clone());
        assert!(matches!(check(&two, &listed), Err(LayoutError::Layers(2))));
        assert!(matches!(check(manifest, "{}"), Err(LayoutError::Config(_))));
    }
}
