//! Hot reload of `wdp run`'s config, end to end: the real binary over fixture trees, real
//! `generic` guests, the kubelet stand-in over its Unix socket. A reload must restart only what
//! changed: an untouched scanner's resource keeps its socket (same inode), its registration and
//! its ListAndWatch stream (the stand-in sees no new Register and no stream end for it).

use std::os::unix::fs::{MetadataExt, symlink};
use std::path::Path;

use wdp_tests::fixture::Fixture;
use wdp_tests::guest;
use wdp_tests::host::{Seen, serve, sockets};
use wdp_tests::write_renamed;

/// Scanner `a`'s resource: /dev/video* through `generic`.
const A: &str = "a.example.com/video";
const A_SOCKET: &str = "a.example.com-video.sock";
/// Scanner `b`'s resource before and after its env changes.
const B_SERIAL: &str = "b.example.com/serial";
const B_SERIAL_SOCKET: &str = "b.example.com-serial.sock";
const B_ACM: &str = "b.example.com/acm";
/// Scanner `c`'s resource.
const C: &str = "c.example.com/sensor";
const C_SOCKET: &str = "c.example.com-sensor.sock";

/// One `generic` scanner serving the device nodes matching `glob` as `<namespace>/<dev_type>`.
fn generic(name: &str, namespace: &str, dev_type: &str, glob: &str) -> String {
    format!(
        "  - name: {name}
    component: {generic}
    namespace: {namespace}
    env:
      RESCAN_INTERVAL_MS: 600000
      DEVICES: '[{{\"name\": \"{dev_type}\", \"groups\": [{{\"paths\": [{{\"path\": \"{glob}\"}}]}}]}}]'
",
        generic = guest("generic").display(),
    )
}

fn a() -> String {
    generic("a", "a.example.com", "video", "/dev/video*")
}

fn b_serial() -> String {
    generic("b", "b.example.com", "serial", "/dev/ttyUSB*")
}

fn b_acm() -> String {
    generic("b", "b.example.com", "acm", "/dev/ttyACM*")
}

fn c() -> String {
    generic("c", "c.example.com", "sensor", "/dev/sensor*")
}

fn config(scanners: &[String]) -> String {
    format!("scanners:\n{}", scanners.concat())
}

/// Device nodes for every scanner above.
fn fixture() -> Fixture {
    let f = Fixture::new();
    f.char_dev("video0", 81, 0)
        .char_dev("ttyUSB0", 188, 0)
        .char_dev("ttyACM0", 166, 0)
        .char_dev("sensor0", 240, 0);
    f
}

/// What identifies one socket file: a socket bound again is a new inode, and even if the
/// filesystem hands out the same inode number again, its change time differs.
fn socket_id(path: &Path) -> (u64, i64, i64) {
    let m = std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (m.ino(), m.ctime(), m.ctime_nsec())
}

/// Hot-plugs another node for `a` and waits until kubelet's stream for it carries the new list:
/// every event up to then has been seen, so the registration and stream-end counts are final.
async fn barrier_on_a(f: &Fixture, seen: &mut Seen, ids: &[&str]) {
    let id = ids.last().expect("the new device");
    let minor = id.trim_start_matches("video").parse().unwrap();
    f.char_dev(id, 81, minor);
    seen.devices(A, ids).await;
}

/// (1) Changing one scanner's env restarts it alone: the other keeps socket, registration and
/// stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_one_scanner_leaves_the_other_streaming() {
    let f = fixture();
    let path = f.path().join("wdp.yaml");
    std::fs::write(&path, config(&[a(), b_serial()])).unwrap();
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &path, &plugins);
    seen.devices(A, &["video0"]).await;
    seen.devices(B_SERIAL, &["ttyUSB0"]).await;
    host.logged("config loaded: added [a, b]", 1).await;
    let a_socket = socket_id(&plugins.join(A_SOCKET));

    write_renamed(&path, &config(&[a(), b_acm()]));
    seen.ended(B_SERIAL).await;
    seen.devices(B_ACM, &["ttyACM0"]).await;
    let log = host
        .logged(
            "config reloaded: added [], removed [], changed [b], unchanged [a]",
            1,
        )
        .await;
    assert!(
        log.contains("scanner b changed (env): restarting it"),
        "{log}"
    );
    assert!(!plugins.join(B_SERIAL_SOCKET).exists());

    barrier_on_a(&f, &mut seen, &["video0", "video1"]).await;
    assert_eq!(seen.registrations(A), 1, "a registered again");
    assert_eq!(
        seen.stream_ends(A),
        0,
        "a's ListAndWatch stream was interrupted"
    );
    assert_eq!(
        socket_id(&plugins.join(A_SOCKET)),
        a_socket,
        "a's socket was replaced"
    );
    assert_eq!(seen.registrations(B_ACM), 1);
    kubelet
        .allocate(A, &["video1"])
        .await
        .expect("a still allocates");

    let status = host.terminate().await;
    assert!(status.success(), "exit status {status}");
    assert_eq!(sockets(&plugins), ["kubelet.sock"]);
}

/// (2) Adding a scanner registers its resource; removing one ends its stream and removes its
/// socket; renaming one is a remove and an add, and the new name may claim the same resource.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_removing_and_renaming_scanners() {
    let f = fixture();
    let path = f.path().join("wdp.yaml");
    std::fs::write(&path, config(&[a()])).unwrap();
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &path, &plugins);
    seen.devices(A, &["video0"]).await;

    // Written in place this time (truncate, write): the watch sees that too.
    std::fs::write(&path, config(&[a(), c()])).unwrap();
    seen.devices(C, &["sensor0"]).await;
    host.logged(
        "config reloaded: added [c], removed [], changed [], unchanged [a]",
        1,
    )
    .await;
    assert!(plugins.join(C_SOCKET).exists());

    write_renamed(&path, &config(&[c()]));
    seen.ended(A).await;
    host.logged(
        "config reloaded: added [], removed [a], changed [], unchanged [c]",
        1,
    )
    .await;
    assert!(
        !plugins.join(A_SOCKET).exists(),
        "a's socket was left behind"
    );
    assert_eq!(
        seen.registrations(C),
        1,
        "c was restarted when a was removed"
    );

    // Renamed: c stops (and releases its resource) before c2 starts and claims it.
    write_renamed(&path, &config(&[c().replace("name: c", "name: c2")]));
    host.logged(
        "config reloaded: added [c2], removed [c], changed [], unchanged []",
        1,
    )
    .await;
    seen.until("c served again, under c2", |s| s.registrations(C) == 2)
        .await;
    kubelet
        .allocate(C, &["sensor0"])
        .await
        .expect("c2 serves sensor0");
    let log = host.log();
    assert!(
        !log.contains("already served by"),
        "c2 clashed with c:\n{log}"
    );
    assert_eq!(sockets(&plugins), [C_SOCKET, "kubelet.sock"]);
}

/// (3) A config that fails any check is refused with an error naming the problem, and the
/// running scanners are left alone; a good config then applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_configs_are_refused_and_the_old_one_keeps_running() {
    let f = fixture();
    let path = f.path().join("wdp.yaml");
    std::fs::write(&path, config(&[a(), b_serial()])).unwrap();
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &path, &plugins);
    seen.devices(A, &["video0"]).await;
    seen.devices(B_SERIAL, &["ttyUSB0"]).await;
    let a_socket = socket_id(&plugins.join(A_SOCKET));
    let b_socket = socket_id(&plugins.join(B_SERIAL_SOCKET));
    let not_wasm = f.path().join("not-a-component.wasm");
    std::fs::write(&not_wasm, b"\0asm but not really").unwrap();

    let shown = path.display().to_string();
    let bad = [
        // Not YAML at all.
        (
            "scanners: [ {name: a".to_string(),
            format!("config {shown}: "),
        ),
        // A component that does not exist.
        (
            config(&[
                a(),
                b_acm().replace(
                    &guest("generic").display().to_string(),
                    "/nonexistent/b.wasm",
                ),
            ]),
            format!("config {shown}: scanners[1].component: /nonexistent/b.wasm: no such file"),
        ),
        // Two scanners of one name.
        (
            config(&[a(), b_serial(), b_acm()]),
            format!("config {shown}: scanners[2].name: \"b\" is used by another scanner"),
        ),
        // A namespace kubelet would refuse to register, on every attempt.
        (
            config(&[
                a(),
                generic("b", "requests.example.com", "acm", "/dev/ttyACM*"),
            ]),
            format!(
                "config {shown}: scanners[1].namespace: \"requests.example.com\": kubelet refuses a resource name <namespace>/<dev-type> that starts with \"requests.\""
            ),
        ),
        // Passes the file checks, fails to compile: refused before b is stopped.
        (
            config(&[
                a(),
                b_acm().replace(
                    &guest("generic").display().to_string(),
                    &not_wasm.display().to_string(),
                ),
            ]),
            format!(
                "config {shown}: scanners[1]: scanner b: {} is not a valid wasm component",
                not_wasm.display()
            ),
        ),
    ];
    for (i, (text, error)) in bad.iter().enumerate() {
        write_renamed(&path, text);
        let log = host
            .logged(
                "config reload refused, the running scanners are kept",
                i + 1,
            )
            .await;
        let line = log
            .lines()
            .filter(|l| l.contains("config reload refused"))
            .nth(i)
            .unwrap();
        assert!(
            line.contains(error.as_str()),
            "{line:?} should contain {error:?}"
        );
    }
    assert!(!host.log().contains("config reloaded"));
    assert_eq!(socket_id(&plugins.join(A_SOCKET)), a_socket);
    assert_eq!(socket_id(&plugins.join(B_SERIAL_SOCKET)), b_socket);
    kubelet
        .allocate(B_SERIAL, &["ttyUSB0"])
        .await
        .expect("b still allocates");

    // A resource already served by another scanner: the config is valid (which resources a
    // scanner reports is known only once it runs), the newcomer's clashing type is not served,
    // and a is not disturbed.
    // Two distinct names that kubelet would give one socket (b.example-x-y.sock, and one CDI
    // spec name): whichever of x and y claims it second is not served.
    let dup = generic("dup", "a.example.com", "video", "/dev/video*");
    let x = generic("x", "b.example", "x-y", "/dev/video*");
    let y = generic("y", "b.example-x", "y", "/dev/video*");
    write_renamed(&path, &config(&[a(), b_serial(), dup, x, y]));
    host.logged(
        "config reloaded: added [dup, x, y], removed [], changed [], unchanged [a, b]",
        1,
    )
    .await;
    host.logged(
        "resource a.example.com/video is already served by scanner \"a\"",
        1,
    )
    .await;
    host.logged("would share the socket b.example-x-y.sock", 1)
        .await;

    // And a good config applies.
    write_renamed(&path, &config(&[a(), b_acm()]));
    host.logged(
        "config reloaded: added [], removed [dup, x, y], changed [b], unchanged [a]",
        1,
    )
    .await;
    seen.devices(B_ACM, &["ttyACM0"]).await;
    seen.ended(B_SERIAL).await;

    barrier_on_a(&f, &mut seen, &["video0", "video1"]).await;
    assert_eq!(seen.registrations(A), 1, "a registered again");
    assert_eq!(seen.stream_ends(A), 0, "a's stream was interrupted");
    assert_eq!(socket_id(&plugins.join(A_SOCKET)), a_socket);
    assert_eq!(
        seen.registrations(B_SERIAL),
        1,
        "b restarted by a refused config"
    );
    assert_eq!(seen.stream_ends(B_SERIAL), 1);
}

/// (4) A Kubernetes ConfigMap volume: the file is a symlink through `..data`, which the kubelet
/// swaps atomically to a new timestamped directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configmap_symlink_swap_reloads() {
    let f = fixture();
    let volume = f.path().join("configmap");
    let first = volume.join("..2026_11_30_16_00_00.000000001");
    std::fs::create_dir_all(&first).unwrap();
    std::fs::write(first.join("wdp.yaml"), config(&[a()])).unwrap();
    symlink(first.file_name().unwrap(), volume.join("..data")).unwrap();
    symlink("..data/wdp.yaml", volume.join("wdp.yaml")).unwrap();
    let path = volume.join("wdp.yaml");
    let plugins = f.plugin_dir();
    let (_kubelet, mut seen, host) = serve(&f, &path, &plugins);
    seen.devices(A, &["video0"]).await;

    // What kubelet's atomic writer does: new directory, new `..data_tmp` link renamed over
    // `..data`, old directory removed. `wdp.yaml` itself is never touched.
    let second = volume.join("..2026_11_30_16_05_00.000000002");
    std::fs::create_dir_all(&second).unwrap();
    std::fs::write(second.join("wdp.yaml"), config(&[a(), c()])).unwrap();
    symlink(second.file_name().unwrap(), volume.join("..data_tmp")).unwrap();
    std::fs::rename(volume.join("..data_tmp"), volume.join("..data")).unwrap();
    std::fs::remove_dir_all(&first).unwrap();

    seen.devices(C, &["sensor0"]).await;
    host.logged(
        "config reloaded: added [c], removed [], changed [], unchanged [a]",
        1,
    )
    .await;
    barrier_on_a(&f, &mut seen, &["video0", "video1"]).await;
    assert_eq!((seen.registrations(A), seen.stream_ends(A)), (1, 0));
}

/// (5) SIGHUP reloads, re-reading component files: a component rebuilt in place (same path,
/// new contents) restarts its scanner; with nothing changed nothing restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_and_sees_rebuilt_components() {
    let f = fixture();
    f.char_dev("kvm", 10, 232);
    let component = f.path().join("scanner.wasm");
    std::fs::copy(guest("generic"), &component).unwrap();
    let path = f.path().join("wdp.yaml");
    // A relative component path: resolved against the config's directory.
    std::fs::write(
        &path,
        config(&[a().replace(&guest("generic").display().to_string(), "scanner.wasm")]),
    )
    .unwrap();
    let plugins = f.plugin_dir();
    let (_kubelet, mut seen, host) = serve(&f, &path, &plugins);
    seen.devices(A, &["video0"]).await;
    let a_socket = socket_id(&plugins.join(A_SOCKET));

    host.signal("HUP");
    host.logged(
        "config reloaded: added [], removed [], changed [], unchanged [a]",
        1,
    )
    .await;

    // Rebuilt in place: now it is the kvm scanner. Only SIGHUP looks at component files.
    let tmp = f.path().join("scanner.wasm.new");
    std::fs::copy(guest("kvm"), &tmp).unwrap();
    std::fs::rename(&tmp, &component).unwrap();
    barrier_on_a(&f, &mut seen, &["video0", "video1"]).await;
    assert_eq!(seen.registrations(A), 1, "a restarted without a reload");
    assert_eq!(socket_id(&plugins.join(A_SOCKET)), a_socket);

    host.signal("HUP");
    let log = host
        .logged(
            "config reloaded: added [], removed [], changed [a], unchanged []",
            1,
        )
        .await;
    assert!(
        log.contains("scanner a changed (component contents): restarting it"),
        "{log}"
    );
    seen.ended(A).await;
    seen.until("the kvm scanner's resource", |s| {
        s.registrations("a.example.com/kvm") == 1
    })
    .await;
    assert!(!plugins.join(A_SOCKET).exists());
}

/// Two scanners swap their resources in one reload: every stop happens before any start, so
/// neither finds the other still holding its new resource.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_scanners_swap_resources_in_one_reload() {
    let f = fixture();
    let path = f.path().join("wdp.yaml");
    let one = "s.example.com/one";
    let two = "s.example.com/two";
    std::fs::write(
        &path,
        config(&[
            generic("p", "s.example.com", "one", "/dev/video*"),
            generic("q", "s.example.com", "two", "/dev/ttyUSB*"),
        ]),
    )
    .unwrap();
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &path, &plugins);
    seen.devices(one, &["video0"]).await;
    seen.devices(two, &["ttyUSB0"]).await;

    write_renamed(
        &path,
        &config(&[
            generic("p", "s.example.com", "two", "/dev/video*"),
            generic("q", "s.example.com", "one", "/dev/ttyUSB*"),
        ]),
    );
    host.logged(
        "config reloaded: added [], removed [], changed [p, q], unchanged []",
        1,
    )
    .await;
    seen.until("both resources registered again", |s| {
        s.registrations(one) == 2 && s.registrations(two) == 2
    })
    .await;
    // Each resource now carries the other scanner's devices (asked through the registration
    // kubelet holds now: stream events of the old and the new server may interleave).
    let node = |r: wdp_kubelet::api::AllocateResponse| {
        r.container_responses[0].devices[0].host_path.clone()
    };
    let r = kubelet
        .allocate(one, &["ttyUSB0"])
        .await
        .expect("one serves ttyUSB0");
    assert_eq!(node(r), "/dev/ttyUSB0");
    let r = kubelet
        .allocate(two, &["video0"])
        .await
        .expect("two serves video0");
    assert_eq!(node(r), "/dev/video0");
    let log = host.log();
    assert!(!log.contains("already served by"), "{log}");
}
