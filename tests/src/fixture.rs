//! Fixture trees: a temp directory holding `sys/` and `dev/` shaped like the real thing.
//!
//! Device nodes are real character devices made with `mknod` (the tests run as root), so the
//! host's devfs sees exactly what it sees on a node; sysfs entries are plain files and the same
//! relative symlinks real sysfs uses (`class/x -> ../../devices/...`).

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use rustix::fs::{CWD, FileType, Mode, makedev, mknodat};

/// A sys root and a dev root in a temp directory, removed on drop.
pub struct Fixture {
    dir: tempfile::TempDir,
}

impl Default for Fixture {
    fn default() -> Self {
        Self::new()
    }
}

impl Fixture {
    /// Empty `sys/` and `dev/` directories.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        fs::create_dir_all(dir.path().join("sys")).expect("mkdir sys");
        fs::create_dir_all(dir.path().join("dev")).expect("mkdir dev");
        Fixture { dir }
    }

    /// The fixture's top directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The sys root (`<tmp>/sys`).
    pub fn sys(&self) -> PathBuf {
        self.dir.path().join("sys")
    }

    /// The dev root (`<tmp>/dev`).
    pub fn dev(&self) -> PathBuf {
        self.dir.path().join("dev")
    }

    /// Writes `yaml` as the fixture's `wdp run` config (`<fixture>/wdp.yaml`) and returns its
    /// path.
    pub fn write_config(&self, yaml: &str) -> PathBuf {
        let path = self.path().join("wdp.yaml");
        write(&path, yaml);
        path
    }

    /// The plugin directory the kubelet stand-in and `wdp run` share (`<fixture>/plugins`),
    /// made if missing.
    pub fn plugin_dir(&self) -> PathBuf {
        let dir = self.path().join("plugins");
        fs::create_dir_all(&dir).expect("mkdir plugins");
        dir
    }

    /// Makes a character device `dev/<rel>` with the given numbers (parents created).
    pub fn char_dev(&self, rel: &str, major: u32, minor: u32) -> &Self {
        let path = self.dev().join(rel);
        mknod_char(&path, major, minor);
        self
    }

    /// Removes `dev/<rel>`.
    pub fn remove_dev(&self, rel: &str) -> &Self {
        fs::remove_file(self.dev().join(rel)).expect("remove dev node");
        self
    }

    /// Writes the sysfs attribute `sys/<rel>` (parents created).
    pub fn sys_file(&self, rel: &str, contents: &str) -> &Self {
        write(&self.sys().join(rel), contents);
        self
    }

    /// Makes the directory `sys/<rel>`.
    pub fn sys_dir(&self, rel: &str) -> &Self {
        fs::create_dir_all(self.sys().join(rel)).expect("mkdir");
        self
    }

    /// Makes the symlink `sys/<link> -> <target>` (target stored verbatim, usually relative).
    pub fn sys_link(&self, link: &str, target: &str) -> &Self {
        link_at(&self.sys().join(link), target);
        self
    }

    /// Makes the symlink `dev/<link> -> <target>`.
    pub fn dev_link(&self, link: &str, target: &str) -> &Self {
        link_at(&self.dev().join(link), target);
        self
    }

    /// A sysfs device under `devices/<path>` with `attrs`, linked from `class/<class>/<name>`
    /// with the relative link real sysfs has.
    pub fn sys_class_device(
        &self,
        class: &str,
        name: &str,
        device_path: &str,
        attrs: &[(&str, &str)],
    ) -> &Self {
        let dev_dir = format!("devices/{device_path}");
        self.sys_dir(&dev_dir);
        for (k, v) in attrs {
            self.sys_file(&format!("{dev_dir}/{k}"), v);
        }
        let depth = 2; // class/<class>/
        let target = format!("{}{dev_dir}", "../".repeat(depth));
        self.sys_dir(&format!("class/{class}"));
        self.sys_link(&format!("class/{class}/{name}"), &target);
        self
    }
}

/// Where fixture PCI functions live: `sys/devices/pci0000:00/<bdf>` (one root bus is enough for
/// the links scanners follow; their relative targets are the kernel's).
pub const PCI_ROOT: &str = "devices/pci0000:00";

impl Fixture {
    /// A PCI function `bdf` with attributes `attrs` (e.g. `("vendor", "0x8086")`), listed in
    /// `bus/pci/devices/<bdf>` by the relative link real sysfs has. Returns its directory
    /// relative to the sys root, for adding children (`drm/card0`, `virtfn0`, ...).
    pub fn pci_device(&self, bdf: &str, attrs: &[(&str, &str)]) -> String {
        let dir = format!("{PCI_ROOT}/{bdf}");
        self.sys_dir(&dir);
        for (k, v) in attrs {
            self.sys_file(&format!("{dir}/{k}"), &format!("{v}\n"));
        }
        self.sys_dir("bus/pci/devices");
        self.sys_link(
            &format!("bus/pci/devices/{bdf}"),
            &format!("../../../{dir}"),
        );
        dir
    }

    /// Binds the PCI function `bdf` to `driver`: `<dev>/driver -> bus/pci/drivers/<driver>` and
    /// `bus/pci/drivers/<driver>/<bdf> -> <dev>`, replacing an earlier binding.
    pub fn pci_bind(&self, bdf: &str, driver: &str) -> &Self {
        self.pci_unbind(bdf);
        let dir = format!("{PCI_ROOT}/{bdf}");
        self.sys_dir(&format!("bus/pci/drivers/{driver}"));
        self.sys_link(
            &format!("{dir}/driver"),
            &format!("../../../bus/pci/drivers/{driver}"),
        );
        self.sys_link(
            &format!("bus/pci/drivers/{driver}/{bdf}"),
            &format!("../../../../{dir}"),
        );
        self
    }

    /// Unbinds the PCI function `bdf` from its driver, if any.
    pub fn pci_unbind(&self, bdf: &str) -> &Self {
        let link = self.sys().join(format!("{PCI_ROOT}/{bdf}/driver"));
        if let Ok(target) = fs::read_link(&link) {
            if let Some(driver) = target.file_name() {
                let back = self.sys().join("bus/pci/drivers").join(driver).join(bdf);
                let _ = fs::remove_file(back);
            }
            fs::remove_file(&link).expect("remove driver link");
        }
        self
    }

    /// Puts the PCI function `bdf` in IOMMU group `group`: `<dev>/iommu_group ->
    /// kernel/iommu_groups/<group>` and `kernel/iommu_groups/<group>/devices/<bdf> -> <dev>`.
    pub fn pci_iommu_group(&self, bdf: &str, group: &str) -> &Self {
        let dir = format!("{PCI_ROOT}/{bdf}");
        let g = format!("kernel/iommu_groups/{group}");
        self.sys_dir(&format!("{g}/devices"));
        self.sys_link(&format!("{dir}/iommu_group"), &format!("../../../{g}"));
        self.sys_link(&format!("{g}/devices/{bdf}"), &format!("../../../../{dir}"));
        self
    }
}

/// `mknod` a character device, creating parents.
pub fn mknod_char(path: &Path, major: u32, minor: u32) {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).expect("mkdir parent");
    }
    mknodat(
        CWD,
        path,
        FileType::CharacterDevice,
        Mode::from_raw_mode(0o660),
        makedev(major, minor),
    )
    .unwrap_or_else(|e| panic!("mknod {} (tests must run as root): {e}", path.display()));
}

fn write(path: &Path, contents: &str) {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).expect("mkdir parent");
    }
    fs::write(path, contents).expect("write fixture file");
}

fn link_at(link: &Path, target: &str) {
    if let Some(parent) = link.parent() {
        fs::create_dir_all(parent).expect("mkdir parent");
    }
    symlink(target, link).expect("symlink");
}

/// A tmpfs mounted on a directory, unmounted when this is dropped: also when a test fails
/// half-way, so no mount outlives the fixture (and its temporary directory can be removed).
#[derive(Debug)]
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a fresh tmpfs with `options` (`mount -o`) on `dir`, which must exist; `None` where
    /// this process may not mount.
    pub fn mount(dir: &Path, options: &str) -> Option<Self> {
        std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "wdp-tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success())
            .then(|| Tmpfs(dir.to_path_buf()))
    }

    /// Remounts it with `options` (`ro`, `rw`); false when that fails.
    pub fn remount(&self, options: &str) -> bool {
        std::process::Command::new("mount")
            .args(["-o", &format!("remount,{options}")])
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}
