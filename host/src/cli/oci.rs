//! `wdp push`, `wdp pull`, `wdp inspect`, `wdp sign`: scanners as OCI artifacts.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use wdp_oci::{self as oci, Registry, RegistryOptions};

/// How to reach the registry.
#[derive(Debug, Args)]
pub struct RegistryArgs {
    /// Speak plain HTTP to the reference's registry (local registries only).
    #[arg(long)]
    insecure: bool,

    /// Registry user; default: the docker config file's credentials, else anonymous.
    #[arg(long, env = "WDP_REGISTRY_USERNAME")]
    username: Option<String>,

    /// Registry password or token.
    #[arg(long, env = "WDP_REGISTRY_PASSWORD", hide_env_values = true)]
    password: Option<String>,
}

impl RegistryArgs {
    fn registry(&self, reference: &str) -> anyhow::Result<Registry> {
        let r = oci::parse_reference(reference)?;
        let insecure = if self.insecure {
            vec![r.registry().to_string()]
        } else {
            Vec::new()
        };
        Ok(Registry::new(RegistryOptions {
            insecure,
            username: self.username.clone(),
            password: self.password.clone(),
        }))
    }
}

/// Push a component to a registry, in the CNCF wasm artifact layout.
///
/// Prints the manifest digest: pin it in the config as oci://REF@sha256:...
/// Example: wdp push kvm.wasm registry.example/scanners/kvm:1.0
#[derive(Debug, Args)]
pub struct PushArgs {
    /// The component (.wasm).
    file: PathBuf,
    /// registry/repository:tag (oci:// optional).
    reference: String,
    #[command(flatten)]
    registry: RegistryArgs,
}

/// Pull a component and check it (layout, digests); write it to a file.
#[derive(Debug, Args)]
pub struct PullArgs {
    /// registry/repository[:tag][@sha256:digest] (oci:// optional).
    reference: String,
    /// Where to write it [default: the repository's last part + .wasm].
    #[arg(short, long)]
    output: Option<PathBuf>,
    #[command(flatten)]
    registry: RegistryArgs,
}

/// Describe a component file or reference: world, imports, exports, digest, size.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// A .wasm file, or a registry reference.
    target: String,
    #[command(flatten)]
    registry: RegistryArgs,
}

/// Sign a pushed component with a P-256 key, in cosign's format.
///
/// Writes the signature next to the artifact (tag sha256-<digest>.sig). `wdp run` checks it when
/// the scanner's config names the public key (verify-key); `cosign verify --key` can check it too.
/// Make a key pair with: openssl ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8
/// -nocrypt -out key.pem && openssl ec -in key.pem -pubout -out key.pub
#[derive(Debug, Args)]
pub struct SignArgs {
    /// registry/repository[:tag][@sha256:digest] (oci:// optional).
    reference: String,
    /// Unencrypted PKCS#8 PEM P-256 private key.
    #[arg(long, value_name = "FILE")]
    key: PathBuf,
    #[command(flatten)]
    registry: RegistryArgs,
}

pub async fn push(args: PushArgs) -> anyhow::Result<ExitCode> {
    let registry = args.registry.registry(&args.reference)?;
    let digest = registry.push(&args.file, &args.reference).await?;
    println!("{digest}");
    Ok(ExitCode::SUCCESS)
}

pub async fn pull(args: PullArgs) -> anyhow::Result<ExitCode> {
    let registry = args.registry.registry(&args.reference)?;
    let pulled = registry.pull(&args.reference).await?;
    let output = match args.output {
        Some(o) => o,
        None => {
            let r = oci::parse_reference(&args.reference)?;
            let name = r.repository().rsplit('/').next().unwrap_or("component");
            PathBuf::from(format!("{name}.wasm"))
        }
    };
    std::fs::write(&output, &pulled.bytes)
        .with_context(|| format!("cannot write {}", output.display()))?;
    println!("{} {}", pulled.manifest_digest, output.display());
    Ok(ExitCode::SUCCESS)
}

pub async fn inspect(args: InspectArgs) -> anyhow::Result<ExitCode> {
    let (component, digest, size, manifest) = if Path::new(&args.target).is_file() {
        let bytes =
            std::fs::read(&args.target).with_context(|| format!("cannot read {}", args.target))?;
        let digest = oci::sha256_digest(&bytes);
        let size = bytes.len();
        let world = oci::artifact::ComponentWorld::of(&bytes)
            .with_context(|| format!("{}: not a wasm component", args.target))?;
        (Some(world), digest, size, None)
    } else {
        let registry = args.registry.registry(&args.target)?;
        let pulled = registry.pull(&args.target).await?;
        (
            pulled.config.component,
            pulled.layer_digest,
            pulled.bytes.len(),
            Some(pulled.manifest_digest),
        )
    };
    let role = |r| oci::check_world(&args.target, component.as_ref(), r).is_ok();
    let world = match (role(oci::Role::Scanner), role(oci::Role::Hooks)) {
        (true, true) => "scanner and hooks (runs as a scanner and as a post-allocator)",
        (true, false) => "scanner",
        (false, true) => "hooks (use as post-allocator)",
        (false, false) => "not a wdp component",
    };
    println!("world:    {world}");
    if let Some(m) = manifest {
        println!("manifest: {m}");
    }
    println!("digest:   {digest}");
    println!("size:     {size} bytes");
    let (exports, imports) = component
        .as_ref()
        .map(|c| (c.exports.as_slice(), c.imports.as_slice()))
        .unwrap_or_default();
    println!("exports:");
    for e in exports {
        println!("  {e}");
    }
    println!("imports:");
    for i in imports {
        println!("  {i}");
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn sign(args: SignArgs) -> anyhow::Result<ExitCode> {
    let key = oci::sign::signing_key(&args.key)?;
    let registry = args.registry.registry(&args.reference)?;
    let signature = oci::sign::sign(&registry, &args.reference, &key).await?;
    println!("{signature}");
    Ok(ExitCode::SUCCESS)
}
