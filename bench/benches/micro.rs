//! Criterion micro-benchmarks of the host's hot paths, on fixture trees with real device nodes
//! (mknod: run as root). `make bench` runs them with short warm-up and measurement times and the
//! driver copies the results into `bench/RESULTS.md`.
//!
//! The 10,000-device rows are the steps a notified tree goes through before kubelet sees it:
//! validation (`DeviceTree::from_guest`), the policy (which stats every node), NUMA derivation,
//! the validation stage as the host runs it (which looks up only nodes that changed), the same
//! for changes alone (contract 0.1.2),
//! the manager's apply of a changed tree and the copy a group costs, and the ListAndWatch
//! message. Each row measures an operation of wdp's public surface (the stages, the manager, a
//! served resource's answers), never a step made public for it.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use prost::Message;
use wdp::hostfs::DevFs;
use wdp::manager::Manager;
use wdp::policy::Policy;
use wdp::server::ServedResource;
use wdp::status::ScannerHandle;
use wdp::topology::Topology;
use wdp::tree::DeviceTree;
use wdp_bench::fixtures::{self, Fixture};
use wdp_kubelet::api;
use wdp_kubelet::dir::PluginDir;
use wdp_kubelet::names::Resource;
use wdp_kubelet::server::{PluginSockets, ResourcePlugin};

const BULK: usize = 10_000;

fn ten_thousand(c: &mut Criterion) {
    let f = Fixture::new();
    fixtures::bulk(&f, "bulk", BULK);
    let devfs = DevFs::open(&f.dev()).expect("dev root");
    let topology = Topology::new(&f.sys());
    let policy = Policy::default();
    let groups = fixtures::synthetic_tree("bulk", "bulk", BULK, false);

    c.bench_function("tree/from_guest 10k devices", |b| {
        b.iter_batched(
            || groups.clone(),
            |g| DeviceTree::from_guest(g).expect("valid"),
            BatchSize::LargeInput,
        )
    });
    c.bench_function("policy/check_tree 10k devices (node-exists stats)", |b| {
        b.iter_batched(
            || groups.clone(),
            |g| policy.check_tree(g, &devfs).expect("valid"),
            BatchSize::LargeInput,
        )
    });
    // The validation stage as the host runs it, the tree's nodes unchanged since the last one
    // (what it knows of them kept): the two rows above are what it does without that.
    let mut validator = wdp::validate::Validator::new(
        "bulk".into(),
        std::sync::Arc::new(policy.clone()),
        std::sync::Arc::default(),
        std::sync::Arc::new(DevFs::open(&f.dev()).expect("dev root")),
        std::sync::Arc::new(Topology::new(&f.sys())),
    );
    validator.check(groups.clone()).expect("valid");
    c.bench_function(
        "validate/check 10k devices, nodes unchanged since the last tree",
        |b| {
            b.iter_batched(
                || groups.clone(),
                |g| validator.check(g).expect("valid"),
                BatchSize::LargeInput,
            )
        },
    );
    // The same stage for a guest that tells only what changed (contract 0.1.2): the last
    // device's health flips, and the patched tree to serve comes out.
    let kept = validator.check(groups.clone()).expect("valid");
    validator.keep(&kept);
    let mut last = groups[0].devices[BULK - 1].clone();
    c.bench_function(
        "validate/check_changes 10k devices, one changed (0.1.2)",
        |b| {
            b.iter_batched(
                || {
                    last.info.health = match last.info.health {
                        wdp::bindings::types::Health::Healthy => {
                            wdp::bindings::types::Health::Unhealthy
                        }
                        wdp::bindings::types::Health::Unhealthy => {
                            wdp::bindings::types::Health::Healthy
                        }
                    };
                    let mut set = wdp::changes::ChangeSet::default();
                    set.merge(
                        vec![wdp::bindings::types::GroupChanges {
                            dev_type: "bulk".into(),
                            changed: vec![last.clone()],
                            removed: vec![],
                        }],
                        vec![],
                        1,
                    );
                    set
                },
                |set| validator.check_changes(set).expect("valid"),
                BatchSize::LargeInput,
            )
        },
    );
    let tree = policy.check_tree(groups.clone(), &devfs).expect("valid");
    c.bench_function("topology/fill 10k devices (no sysfs entry)", |b| {
        b.iter_batched(
            || tree.clone(),
            |mut t| {
                topology.fill(&mut t, &devfs);
                t
            },
            BatchSize::LargeInput,
        )
    });
    let mut changed = tree.clone();
    if let Some(group) = changed.0.get_mut("bulk") {
        let (id, mut info) = group.get_max().cloned().expect("devices");
        info.health = wdp::tree::Health::Unhealthy;
        group.insert(id, info);
    }
    // A manager serving the tree, its servers never run (the runtime is not driven): what
    // applying the next tree costs the scanner's task, kubelet aside. Each tree is a change.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _entered = rt.enter();
    let plugins = f.path().join("device-plugins");
    let sockets = Arc::new(PluginSockets {
        dir: PluginDir::watch(&plugins).expect("watch the plugin dir"),
        socket: plugins.join("kubelet.sock"),
    });
    let mut manager = Manager::new(
        "bulk".into(),
        "bench.wdp.dev".into(),
        sockets,
        None,
        Arc::default(),
    );
    manager.apply(tree.clone());
    let mut flip = false;
    c.bench_function("manager/apply 10k devices, one changed", |b| {
        b.iter_batched(
            || {
                flip = !flip;
                if flip { changed.clone() } else { tree.clone() }
            },
            |t| manager.apply(t),
            BatchSize::LargeInput,
        )
    });
    let group = &tree.0["bulk"];
    c.bench_function(
        "manager/clone of a 10k group (shared: a persistent map)",
        |b| b.iter(|| black_box(group).clone()),
    );
    // What a resource's streams send at each update: the list, its runs that the change falls
    // in encoded again, then the wire.
    let served = ServedResource::new(
        Resource::new("bench.wdp.dev", "bulk", &plugins).expect("a short socket path"),
        None,
        ScannerHandle::detached("bulk").resource("bench.wdp.dev/bulk"),
    );
    let list = |group: &wdp::tree::DeviceGroup| {
        api::ListAndWatchResponse::from_encoded(served.list(group))
    };
    let changed_group = &changed.0["bulk"];
    let mut flip = false;
    c.bench_function("listandwatch/list + encode 10k devices, one changed", |b| {
        b.iter(|| {
            flip = !flip;
            let group = if flip { changed_group } else { group };
            list(black_box(group)).encode_to_vec()
        })
    });
    let bytes = list(group).encode_to_vec();
    c.bench_function("listandwatch/decode 10k devices (kubelet's side)", |b| {
        b.iter(|| api::ListAndWatchResponse::decode(black_box(bytes.as_slice())).expect("decode"))
    });
}

fn allocate_and_devfs(c: &mut Criterion) {
    let f = Fixture::new();
    fixtures::bulk(&f, "bench", 1000);
    let devfs = DevFs::open(&f.dev()).expect("dev root");
    let policy = Policy::default();
    let tree = policy
        .check_tree(
            fixtures::synthetic_tree("bench", "bench", 1000, false),
            &devfs,
        )
        .expect("valid");
    let group = &tree.0["bench"];
    // The Allocate answer a resource without hooks gives, as its server asks for it (polled by a
    // current-thread runtime: the row includes that block_on).
    let served = ServedResource::new(
        Resource::new("bench.wdp.dev", "bench", &f.path().join("device-plugins"))
            .expect("a short socket path"),
        None,
        ScannerHandle::detached("bench").resource("bench.wdp.dev/bench"),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    for n in [1usize, 8] {
        let request = api::ContainerAllocateRequest {
            devices_ids: (0..n).map(|i| format!("bench_d{i}")).collect(),
        };
        let requests = vec![request];
        c.bench_function(
            &format!("allocate/default response + proto encode, {n} device(s)"),
            |b| {
                b.iter_batched(
                    || requests.clone(),
                    |requests| {
                        rt.block_on(served.allocate(group, requests))
                            .expect("known ids")
                            .encode_to_vec()
                    },
                    BatchSize::SmallInput,
                )
            },
        );
    }
    c.bench_function("devfs/stat one node", |b| {
        b.iter(|| devfs.stat(black_box("/dev/bench/d500")).expect("stat"))
    });
    c.bench_function("devfs/read_dir 1000 nodes", |b| {
        b.iter(|| devfs.read_dir(black_box("/dev/bench")).expect("read_dir"))
    });
}

/// What the Allocate path pays per hooked call (`Hooks::post_allocate`: a slot, a fresh store and
/// instance, the call), with the instance from the hooks' pool (the host's) and mapped per call
/// (the scanners' engine, where a hook the pool cannot hold runs).
fn hook_instantiation(c: &mut Criterion) {
    use wdp::bindings::types as wit;
    use wdp::hooks::Hooks;
    use wdp::sandbox::{Guest, Roots, Sandbox};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let f = Fixture::new();
    let sandbox = rt.block_on(async {
        Sandbox::new(Roots {
            sys: f.sys(),
            dev: f.dev(),
        })
        .expect("sandbox")
    });
    let component_path = wdp_tests::guest("test_hooks");
    let requests = vec![wit::ContainerAllocateRequest {
        device_ids: vec!["ttyUSB0".into()],
    }];
    let responses = vec![wit::ContainerAllocateResponse {
        envs: vec![("QAT3".into(), "x".into())],
        mounts: Vec::new(),
        devices: vec![wit::DeviceSpec {
            container_path: "/dev/ttyUSB0".into(),
            host_path: "/dev/ttyUSB0".into(),
            permissions: "rw".into(),
        }],
        annotations: Vec::new(),
        cdi_devices: Vec::new(),
    }];
    for (name, pooled) in [("pooled (the host's)", true), ("mapped per call", false)] {
        let component = rt
            .block_on(async {
                if pooled {
                    sandbox.load_hooks(&component_path).await
                } else {
                    sandbox.load(&component_path).await
                }
            })
            .expect("load");
        let hooks = Hooks::new(
            sandbox.clone(),
            Guest::new("hooks", Vec::new()),
            Arc::new(Policy::default()),
            &component,
        )
        .expect("exports post-allocator");
        c.bench_function(
            &format!("hook/fresh store + instantiate + post-allocate, {name}"),
            |b| {
                b.iter(|| {
                    rt.block_on(hooks.post_allocate("serial", &requests, &responses))
                        .expect("exported")
                        .expect("hook answer")
                })
            },
        );
    }
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = ten_thousand, allocate_and_devfs, hook_instantiation
}
criterion_main!(benches);
