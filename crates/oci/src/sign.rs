//! Signatures in cosign's format, with ECDSA P-256 keys.
//!
//! cosign stores a signature of image `repo@sha256:<hex>` as the artifact tagged
//! `repo:sha256-<hex>.sig`: one layer of media type
//! `application/vnd.dev.cosign.simplesigning.v1+json` whose content is the "simple signing"
//! payload naming the signed manifest digest, with the base64 DER ECDSA signature of that payload
//! in the layer annotation `dev.cosignproject.cosign/signature`. `wdp sign` writes exactly that,
//! so `cosign verify --key <public.pem>` can check what wdp signed, and wdp checks signatures made
//! by cosign with a P-256 key (the key type `cosign generate-key-pair` makes).
//!
//! Verification is offline and keyed: no transparency log, no certificates.

use std::collections::BTreeMap;
use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use oci_client::client::{Config, ImageLayer};
use oci_client::manifest::OciImageManifest;
use p256::ecdsa::signature::{Signer, Verifier};
use p256::ecdsa::{Signature, SigningKey, VerifyingKey};
use p256::pkcs8::{DecodePrivateKey, DecodePublicKey};
use serde_json::json;

use super::{OciError, Registry, parse_reference, sha256_digest};

/// Media type of a simple-signing payload layer.
pub const PAYLOAD_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// Layer annotation holding the base64 signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";

/// A public key to verify with, and its fingerprint (recorded in the cache).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    key: VerifyingKey,
    /// `sha256:` of the PEM text.
    pub fingerprint: String,
}

impl PublicKey {
    /// Reads a PEM `PUBLIC KEY` (P-256).
    pub fn from_file(path: &Path) -> Result<Self, OciError> {
        let pem = std::fs::read_to_string(path).map_err(|e| OciError::File {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let key = VerifyingKey::from_public_key_pem(&pem).map_err(|e| OciError::File {
            path: path.to_path_buf(),
            message: format!("not a PEM P-256 public key: {e}"),
        })?;
        Ok(PublicKey {
            key,
            fingerprint: sha256_digest(pem.trim().as_bytes()),
        })
    }
}

/// Reads a PEM PKCS#8 `PRIVATE KEY` (P-256), unencrypted.
pub fn signing_key(path: &Path) -> Result<SigningKey, OciError> {
    let pem = std::fs::read_to_string(path).map_err(|e| OciError::File {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    SigningKey::from_pkcs8_pem(&pem).map_err(|e| OciError::File {
        path: path.to_path_buf(),
        message: format!("not an unencrypted PKCS#8 P-256 private key: {e}"),
    })
}

/// The simple-signing payload for `manifest_digest` of `repository` (`registry/repo`).
pub fn payload(repository: &str, manifest_digest: &str) -> Vec<u8> {
    json!({
        "critical": {
            "identity": { "docker-reference": repository },
            "image": { "docker-manifest-digest": manifest_digest },
            "type": "cosign container image signature"
        },
        "optional": null
    })
    .to_string()
    .into_bytes()
}

/// `registry/repo:sha256-<hex>.sig`: where cosign keeps the signature of `manifest_digest`.
fn signature_reference(
    reference: &str,
    manifest_digest: &str,
) -> Result<(String, String), OciError> {
    let r = parse_reference(reference)?;
    let repository = format!("{}/{}", r.registry(), r.repository());
    let tag = manifest_digest.replace(':', "-") + ".sig";
    Ok((format!("{repository}:{tag}"), repository))
}

/// Signs the artifact `reference` resolves to with `key`; returns the signature's reference.
pub async fn sign(
    registry: &Registry,
    reference: &str,
    key: &SigningKey,
) -> Result<String, OciError> {
    let pulled = registry.pull(reference).await?;
    let (sig_ref, repository) = signature_reference(reference, &pulled.manifest_digest)?;
    let payload = payload(&repository, &pulled.manifest_digest);
    let signature: Signature = key.sign(&payload);
    let annotations = BTreeMap::from([(
        SIGNATURE_ANNOTATION.to_string(),
        STANDARD.encode(signature.to_der().as_bytes()),
    )]);
    let layer = ImageLayer::new(payload, PAYLOAD_MEDIA_TYPE.into(), Some(annotations));
    let config = Config::oci_v1(b"{}".to_vec(), None);
    let manifest = OciImageManifest::build(std::slice::from_ref(&layer), &config, None);
    let target = parse_reference(&sig_ref)?;
    registry
        .client()
        .push(
            &target,
            &[layer],
            config,
            &registry.auth(&target),
            Some(manifest),
        )
        .await
        .map_err(|e| OciError::Registry {
            reference: sig_ref.clone(),
            message: e.to_string(),
        })?;
    Ok(sig_ref)
}

/// Checks that a signature by `key` over `manifest_digest` is stored next to `reference`.
pub async fn verify(
    registry: &Registry,
    reference: &str,
    manifest_digest: &str,
    key: &PublicKey,
) -> Result<(), OciError> {
    let fail = |message: String| OciError::Signature {
        reference: reference.into(),
        message,
    };
    let (sig_ref, _) = signature_reference(reference, manifest_digest)?;
    let target = parse_reference(&sig_ref)?;
    let auth = registry.auth(&target);
    let (manifest, _) = registry
        .client()
        .pull_image_manifest(&target, &auth)
        .await
        .map_err(|e| fail(format!("no signature at {sig_ref}: {e}")))?;
    let mut reasons = Vec::new();
    for layer in manifest
        .layers
        .iter()
        .filter(|l| l.media_type == PAYLOAD_MEDIA_TYPE)
    {
        let Some(sig_b64) = layer
            .annotations
            .as_ref()
            .and_then(|a| a.get(SIGNATURE_ANNOTATION))
        else {
            reasons.push("a payload layer without a signature annotation".to_string());
            continue;
        };
        let mut payload = Vec::new();
        if let Err(e) = registry
            .client()
            .pull_blob(&target, layer, &mut payload)
            .await
        {
            reasons.push(format!("cannot fetch the payload: {e}"));
            continue;
        }
        match check(&payload, sig_b64, manifest_digest, key) {
            Ok(()) => return Ok(()),
            Err(reason) => reasons.push(reason),
        }
    }
    if reasons.is_empty() {
        reasons.push("no signature layer".into());
    }
    Err(fail(reasons.join("; ")))
}

/// One payload and signature: the signature verifies and the payload names this digest.
fn check(
    payload: &[u8],
    sig_b64: &str,
    manifest_digest: &str,
    key: &PublicKey,
) -> Result<(), String> {
    let der = STANDARD
        .decode(sig_b64)
        .map_err(|e| format!("signature is not base64: {e}"))?;
    let signature =
        Signature::from_der(&der).map_err(|e| format!("signature is not DER ECDSA: {e}"))?;
    key.key
        .verify(payload, &signature)
        .map_err(|_| "the signature does not verify with the configured key".to_string())?;
    let value: serde_json::Value =
        serde_json::from_slice(payload).map_err(|e| format!("payload is not JSON: {e}"))?;
    let signed = value["critical"]["image"]["docker-manifest-digest"].as_str();
    if signed != Some(manifest_digest) {
        return Err(format!(
            "the payload signs {signed:?}, not {manifest_digest}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use p256::pkcs8::{EncodePublicKey, LineEnding};

    #[test]
    fn payload_signatures_check_key_and_digest() {
        let signer = SigningKey::from_slice(&[7u8; 32]).unwrap();
        let pem = signer
            .verifying_key()
            .to_public_key_pem(LineEnding::LF)
            .unwrap();
        let key = PublicKey {
            key: VerifyingKey::from_public_key_pem(&pem).unwrap(),
            fingerprint: String::new(),
        };
        let digest = "sha256:abc";
        let body = payload("r.example/scanners/kvm", digest);
        let sig: Signature = signer.sign(&body);
        let b64 = STANDARD.encode(sig.to_der().as_bytes());
        assert!(check(&body, &b64, digest, &key).is_ok());
        assert!(
            check(&body, &b64, "sha256:other", &key)
                .unwrap_err()
                .contains("signs")
        );
        let other = SigningKey::from_slice(&[9u8; 32]).unwrap();
        let bad: Signature = other.sign(&body);
        let bad = STANDARD.encode(bad.to_der().as_bytes());
        assert!(
            check(&body, &bad, digest, &key)
                .unwrap_err()
                .contains("does not verify")
        );
        assert!(check(&body, "!!", digest, &key).is_err());
    }
}
