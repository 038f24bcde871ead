//! A real OCI registry for the tests: Debian's `docker-registry` (distribution 2.8), listening on
//! 127.0.0.1 on a free port, storing into a temp dir, stopped on drop.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running registry.
pub struct TestRegistry {
    child: Option<Child>,
    /// `127.0.0.1:<port>`.
    pub addr: String,
    storage: tempfile::TempDir,
}

impl TestRegistry {
    /// Starts a registry and waits until it answers `GET /v2/`.
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// Starts a registry that requires basic auth (`user`, and a bcrypt hash of the password).
    pub fn start_with_auth(user: &str, bcrypt: &str) -> Self {
        Self::start_with(Some((user, bcrypt)))
    }

    fn start_with(auth: Option<(&str, &str)>) -> Self {
        let bin = which("docker-registry").unwrap_or_else(|| {
            panic!("docker-registry is not installed: `make setup` installs it (Debian package docker-registry)")
        });
        let storage = tempfile::tempdir().expect("registry storage");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let addr = format!("127.0.0.1:{port}");
        let config = storage.path().join("config.yml");
        let mut yaml = format!(
            "version: 0.1\nlog: {{level: error}}\nstorage:\n  filesystem: {{rootdirectory: {}}}\n  delete: {{enabled: true}}\nhttp: {{addr: {addr}}}\n",
            storage.path().join("data").display()
        );
        if let Some((user, hash)) = auth {
            let htpasswd = storage.path().join("htpasswd");
            std::fs::write(&htpasswd, format!("{user}:{hash}\n")).expect("htpasswd");
            yaml += &format!(
                "auth:\n  htpasswd: {{realm: wdp-test, path: {}}}\n",
                htpasswd.display()
            );
        }
        std::fs::write(&config, yaml).expect("registry config");
        let child = Command::new(bin)
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn docker-registry");
        let registry = TestRegistry {
            child: Some(child),
            addr,
            storage,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !registry.answers() {
            assert!(
                Instant::now() < deadline,
                "docker-registry did not start on {}",
                registry.addr
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        registry
    }

    fn answers(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(&self.addr) else {
            return false;
        };
        let request = format!("GET /v2/ HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr);
        let mut reply = String::new();
        s.write_all(request.as_bytes()).is_ok()
            && s.read_to_string(&mut reply).is_ok()
            // 401 is an answer too: the registry is up and wants credentials.
            && ["200", "401"]
                .iter()
                .any(|code| reply.starts_with(&format!("HTTP/1.0 {code}")) || reply.starts_with(&format!("HTTP/1.1 {code}")))
    }

    /// The stored content of blob `digest` (`sha256:<hex>`), for tampering.
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.storage
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// Stops the registry (it stays stopped).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        self.stop();
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| PathBuf::from(d).join(name))
        .find(|p| p.is_file())
}

/// `sha256:<hex>` of a file, as registries name blobs.
pub fn sha256_file(path: &std::path::Path) -> String {
    wdp_oci::sha256_digest(&std::fs::read(path).expect("read file"))
}
