//! The sandbox against real guests compiled from source: what a hostile guest can observe, and
//! that no guest failure stops the host or another guest.

use std::time::Duration;

use wdp::sandbox::{GuestLimits, Roots, Sandbox};
use wdp::scanner::{RestartPolicy, ScannerEvent};
use wdp_tests::fixture::Fixture;
use wdp_tests::{eventually_showing, ids, run_guest};

fn roots(f: &Fixture) -> Roots {
    Roots {
        sys: f.sys(),
        dev: f.dev(),
    }
}

/// A fixture laid with every trap the probe guest springs.
fn hostile_fixture() -> Fixture {
    let f = Fixture::new();
    f.sys_link("escape-abs", "/etc")
        .sys_link("escape-rel", "../../../../../../../../etc")
        .sys_file("class/wdptest/attr", "original\n")
        .char_dev("null", 1, 3)
        .char_dev("zero", 1, 5)
        .dev_link("escape", "/etc")
        .dev_link("fd", "/proc/self/fd");
    // A device node inside the sys root: real sysfs has none, a crafted root might.
    wdp_tests::fixture::mknod_char(&f.sys().join("devnode"), 1, 5);
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_probes_are_all_denied() {
    let f = hostile_fixture();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let sandbox = Sandbox::new(roots(&f)).unwrap();
    let mut kvm = wdp_tests::healthy_kvm(&sandbox).await;
    let mut guest = run_guest(
        &sandbox,
        "hostile",
        &[("ATTACK", "probe"), ("TCP_PORT", &port)],
        GuestLimits::default(),
        RestartPolicy::Never,
    )
    .await;
    let tree = guest.next_tree().await;
    let report = &tree.0["probe"]["report"].annotations;
    let expected = [
        "read-etc-passwd",
        "sys-dotdot",
        "sys-abs-symlink",
        "sys-rel-symlink",
        "sys-write",
        "sys-create",
        "dev-read-std",
        "sys-dev-node",
        "devfs-dotdot",
        "devfs-escape-link",
        "devfs-outside",
        "tcp-connect",
        "host-env",
        "fd-magic",
        "sys-trailing-slash",
        "devfs-trailing-slash",
        "devfs-long-path",
    ];
    for probe in expected {
        let outcome = report
            .get(probe)
            .unwrap_or_else(|| panic!("probe {probe} missing from {report:?}"));
        assert!(
            outcome.starts_with("denied"),
            "probe {probe} was not denied: {outcome}"
        );
    }
    assert_eq!(
        report.len(),
        expected.len(),
        "unexpected probes: {report:?}"
    );
    // Only the configured variables are visible.
    assert_eq!(report["host-env"], "denied: only [ATTACK, TCP_PORT]");
    assert!(matches!(guest.next().await, ScannerEvent::Finished));
    // Nothing reached the listener, and sysfs was not modified.
    assert!(listener.accept().is_err(), "the guest connected to TCP");
    assert_eq!(
        std::fs::read_to_string(f.sys().join("class/wdptest/attr")).unwrap(),
        "original\n"
    );
    assert!(!f.sys().join("new-file").exists());
    // Another scanner in the same host kept working throughout.
    f.char_dev("kvm", 10, 232);
    assert_eq!(ids(&kvm.next_tree().await, "kvm"), ["kvm-0"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_guests_are_stopped_and_others_keep_working() {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let sandbox = Sandbox::new(roots(&f)).unwrap();
    let limits = GuestLimits {
        memory: 64 << 20,
        call_timeout: Duration::from_secs(1),
    };
    // The healthy scanner only rescans on a change: a new tree proves it is alive and watching.
    let mut kvm = run_guest(
        &sandbox,
        "kvm",
        &[("SLOTS", "2"), ("RESCAN_INTERVAL_MS", "600000")],
        limits,
        RestartPolicy::Backoff,
    )
    .await;
    assert_eq!(ids(&kvm.next_tree().await, "kvm"), ["kvm-0", "kvm-1"]);

    let attacks = [
        ("memory", "exceeded its memory limit of 64 MiB"),
        ("spin", "stopped by the host: ran 1s of CPU"),
        ("panic", "hostile panic"),
        ("recursion", "trapped"),
    ];
    let mut running = Vec::new();
    for (attack, _) in attacks {
        let guest = run_guest(
            &sandbox,
            "hostile",
            &[("ATTACK", attack)],
            limits,
            RestartPolicy::Never,
        )
        .await;
        running.push(guest);
    }
    for ((attack, cause), guest) in attacks.iter().zip(&mut running) {
        let error = guest.failure().await;
        assert!(
            error.contains(cause),
            "{attack}: cause {error:?} should mention {cause:?}"
        );
    }

    // A guest that notified, then spun: stopped, its tree was delivered first.
    let mut spinner = run_guest(
        &sandbox,
        "hostile",
        &[("ATTACK", "notify-then-spin")],
        limits,
        RestartPolicy::Never,
    )
    .await;
    assert_eq!(ids(&spinner.next_tree().await, "before"), ["x"]);
    assert!(spinner.failure().await.contains("CPU"));

    // A flood of 10,000 trees is coalesced, without losing the guest or the host: the trees
    // delivered come in order, at most one per interval of the burst, and the last one always.
    let mut flood = run_guest(
        &sandbox,
        "hostile",
        &[("ATTACK", "flood")],
        limits,
        RestartPolicy::Never,
    )
    .await;
    let mut delivered = Vec::new();
    loop {
        match flood.next().await {
            ScannerEvent::Tree(t) => {
                let id = ids(&t, "flood").pop().expect("one device");
                delivered.push(id[1..].parse::<u32>().expect("n<i>"));
            }
            ScannerEvent::Finished => break,
            other => panic!("flood: unexpected {other:?}"),
        }
    }
    assert_eq!(delivered.last(), Some(&9999), "the last tree is delivered");
    assert!(delivered.is_sorted(), "in order: {delivered:?}");
    assert!(
        delivered.len() < 10_000,
        "a burst is coalesced, yet {} trees were delivered",
        delivered.len()
    );

    // Through all of that the healthy scanner kept running: hot-plug a node and see it.
    f.char_dev("fuse", 10, 229);
    let tree = kvm.next_tree().await;
    assert_eq!(ids(&tree, "fuse"), ["fuse-0", "fuse-1"]);
    assert_eq!(ids(&tree, "kvm"), ["kvm-0", "kvm-1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_scanner_is_restarted_with_backoff() {
    let f = Fixture::new();
    let sandbox = Sandbox::new(roots(&f)).unwrap();
    let mut guest = run_guest(
        &sandbox,
        "hostile",
        &[("ATTACK", "panic")],
        GuestLimits::default(),
        RestartPolicy::Backoff,
    )
    .await;
    let first = std::time::Instant::now();
    let mut restarts = Vec::new();
    for _ in 0..2 {
        match guest.next().await {
            ScannerEvent::Failed {
                restart_in: Some(d),
                ..
            } => restarts.push(d),
            other => panic!("expected a failure with a restart, got {other:?}"),
        }
    }
    assert_eq!(restarts, [Duration::from_secs(1), Duration::from_secs(2)]);
    // The second failure came after the first backoff: the guest really was re-instantiated.
    assert!(first.elapsed() >= Duration::from_secs(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_change_wakes_on_hotplug_and_unplug() {
    let f = Fixture::new();
    let sandbox = Sandbox::new(roots(&f)).unwrap();
    // No node yet, and a rescan interval far longer than the test: only inotify can wake it.
    let mut kvm = run_guest(
        &sandbox,
        "kvm",
        &[("SLOTS", "1"), ("RESCAN_INTERVAL_MS", "600000")],
        GuestLimits::default(),
        RestartPolicy::Never,
    )
    .await;
    assert!(kvm.next_tree().await.0.is_empty());
    // The scanner goes on to wait in the host (when, a loaded machine decides): the epoch clock
    // then parks, an idle host does not tick.
    eventually_showing("no ticks while every guest waits", || async {
        let before = sandbox.clock().ticks();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let idle_ticks = sandbox.clock().ticks() - before;
        if idle_ticks <= 1 {
            Ok(())
        } else {
            Err(format!("{idle_ticks} ticks in 300 ms"))
        }
    })
    .await;
    f.char_dev("net/tun", 10, 200);
    assert_eq!(ids(&kvm.next_tree().await, "tun"), ["tun-0"]);
    f.remove_dev("net/tun");
    assert!(kvm.next_tree().await.0.is_empty());
}

/// A hook's answer to one Allocate of `ttyUSB0`, and the first response's `RESIDUE` env (what
/// the `residue` mode found of an earlier call in its memory).
mod residue {
    use wdp::bindings::types as wit;

    pub fn requests() -> Vec<wit::ContainerAllocateRequest> {
        vec![wit::ContainerAllocateRequest {
            device_ids: vec!["ttyUSB0".into()],
        }]
    }

    pub fn responses() -> Vec<wit::ContainerAllocateResponse> {
        vec![wit::ContainerAllocateResponse {
            envs: Vec::new(),
            mounts: Vec::new(),
            devices: Vec::new(),
            annotations: Vec::new(),
            cdi_devices: Vec::new(),
        }]
    }

    pub fn found(answer: &[wit::ContainerAllocateResponse]) -> usize {
        let envs = &answer.first().expect("one response").envs;
        let (_, found) = envs
            .iter()
            .find(|(k, _)| k == "RESIDUE")
            .expect("RESIDUE in the answer");
        found.parse().expect("a count")
    }

    /// Calls `hooks`' post-allocate `calls` times in a row; each call must find no residue.
    pub async fn none_in_calls(hooks: &wdp::hooks::Hooks, calls: usize) {
        for call in 0..calls {
            let answer = hooks
                .post_allocate("serial", &requests(), &responses())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(found(&answer), 0, "call {call}");
        }
    }
}

/// A sandbox whose hooks' pool is `pool`, `test_hooks` loaded into it, and a maker of its hooks:
/// `test_hooks` in a mode, its calls under a deadline.
async fn hook_sandbox(
    pool: wdp::sandbox::HookPool,
) -> (
    Fixture,
    std::sync::Arc<Sandbox>,
    impl Fn(&str, Duration) -> std::sync::Arc<wdp::hooks::Hooks>,
) {
    use std::sync::Arc;
    use wdp::hooks::Hooks;
    use wdp::policy::Policy;
    use wdp::sandbox::{Guest, SandboxOptions};

    let f = Fixture::new();
    let sandbox = Sandbox::with_options(
        roots(&f),
        SandboxOptions {
            hook_pool: pool,
            ..SandboxOptions::default()
        },
    )
    .unwrap();
    let component = sandbox
        .load_hooks(&wdp_tests::guest("test_hooks"))
        .await
        .unwrap();
    let hooks_of = sandbox.clone();
    let hooks = move |mode: &str, call_timeout: Duration| {
        let guest = Guest {
            limits: GuestLimits {
                call_timeout,
                ..GuestLimits::default()
            },
            ..Guest::new(mode, vec![("HOOK_MODE".into(), mode.into())])
        };
        Arc::new(
            Hooks::new(
                hooks_of.clone(),
                guest,
                Arc::new(Policy::default()),
                &component,
            )
            .unwrap(),
        )
    };
    (f, sandbox, hooks)
}

/// One post-allocate call of `hooks` on [`residue`]'s request.
async fn call_hook(
    hooks: std::sync::Arc<wdp::hooks::Hooks>,
) -> Result<Vec<wdp::bindings::types::ContainerAllocateResponse>, wdp::hooks::HookError> {
    hooks
        .post_allocate("serial", &residue::requests(), &residue::responses())
        .await
        .unwrap()
}

/// Hook instances come from the hooks' pool, whose slots are reused: every call still gets a
/// memory holding nothing of an earlier instance's. The `residue` hook leaves marks in its static
/// data and through 4 MiB of heap, and counts the marks it finds: one instance called twice
/// finds its own (the check sees what is left), and the calls after it, each in a fresh
/// instance in the same slot, find none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_hook_instances_hold_nothing_of_an_earlier_call() {
    use std::sync::Arc;
    use wdp::hooks::Hooks;
    use wdp::policy::Policy;
    use wdp::sandbox::Guest;

    let f = Fixture::new();
    let sandbox = Sandbox::new(roots(&f)).unwrap();
    let component = sandbox
        .load_hooks(&wdp_tests::guest("test_hooks"))
        .await
        .unwrap();
    let guest = Guest::new("residue", vec![("HOOK_MODE".into(), "residue".into())]);
    let metrics = || sandbox.hook_engine().pooling_allocator_metrics().unwrap();

    // The check itself: one instance, two calls, and the second finds what the first left.
    {
        let mut store = sandbox.hook_store(&guest, &component).unwrap();
        let pre = component.post_allocator().unwrap();
        let hook = pre.instantiate_async(&mut store).await.unwrap();
        assert_eq!(metrics().component_instances(), 1, "from the pool");
        let mut call = async || {
            hook.wdp_device_plugin_post_allocator()
                .call_post_allocate(
                    &mut store,
                    "serial",
                    &residue::requests(),
                    &residue::responses(),
                )
                .await
                .unwrap()
                .unwrap()
        };
        assert_eq!(residue::found(&call().await), 0, "a fresh instance");
        assert!(residue::found(&call().await) > 0, "the same instance again");
    }
    assert_eq!(metrics().component_instances(), 0, "the slot went back");

    let hooks = Hooks::new(
        sandbox.clone(),
        guest,
        Arc::new(Policy::default()),
        &component,
    )
    .unwrap();
    residue::none_in_calls(&hooks, 3).await;
    // What is left is the spare made as the last call ran, never entered yet, and the last
    // call's store, waiting for the next call's start: the earlier calls' were dropped as the
    // calls after them started.
    eventually_showing("the spare and the last call's store", || async {
        match (hooks.has_spare(), metrics().component_instances()) {
            (true, 2) => Ok(()),
            (spare, n) => Err(format!("spare {spare}, {n} instances")),
        }
    })
    .await;
    // Instances one or two at a time over the pool's slots: memories were reused, none made
    // past the pool's slots. (Whether one is warm and unused now depends on which slot the
    // spare took.)
    let pool = metrics();
    assert!(
        pool.unused_warm_memories() <= sandbox.hook_pool().slots + sandbox.hook_pool().spares()
    );
    // The hooks dropped (a reload, a stop): the store and the spare go with them.
    drop(hooks);
    eventually_showing("no instance left", || async {
        match metrics().component_instances() {
            0 => Ok(()),
            n => Err(format!("{n} instances")),
        }
    })
    .await;
}

/// A hook component outside the pool (one that fits no slot runs on the scanners' engine) gets
/// a fresh instance per call all the same, each mapped for its call and dropped after it: no
/// spare is made ahead and nothing takes a slot of the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_outside_the_pool_gets_a_fresh_instance_per_call() {
    use std::sync::Arc;
    use wdp::hooks::Hooks;
    use wdp::policy::Policy;
    use wdp::sandbox::Guest;

    let f = Fixture::new();
    let sandbox = Sandbox::new(roots(&f)).unwrap();
    // `load` is the scanners' engine: what `load_hooks` falls back to.
    let component = sandbox.load(&wdp_tests::guest("test_hooks")).await.unwrap();
    assert!(!sandbox.is_pooled(&component));
    let hooks = Hooks::new(
        sandbox.clone(),
        Guest::new("residue", vec![("HOOK_MODE".into(), "residue".into())]),
        Arc::new(Policy::default()),
        &component,
    )
    .unwrap();
    residue::none_in_calls(&hooks, 3).await;
    assert!(!hooks.has_spare());
    let pool = sandbox.hook_engine().pooling_allocator_metrics().unwrap();
    assert_eq!(pool.component_instances(), 0, "nothing from the pool");
}

/// A spare instance (made as a call runs, for the next) is handed to one call only, and is as
/// fresh as one made for the call: calls at once each find no residue of another, a call after
/// one that panicked finds none either, and a spare taken by a hook that spins is still stopped
/// by its deadline and CPU budget, counted from the call's start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spare_hook_instances_are_fresh_and_used_once() {
    use std::sync::Arc;
    use wdp::hooks::{HookError, Hooks};
    use wdp::sandbox::HookPool;

    // Three hooks below, each with a spare: a pool sized for three hooked scanners.
    let (_f, _sandbox, hooks) = hook_sandbox(HookPool::for_hooked_scanners(3)).await;
    let call = call_hook;
    let spare_ready = |hooks: Arc<Hooks>| async move {
        eventually_showing("a spare made as the call ran", || async {
            if hooks.has_spare() {
                Ok(())
            } else {
                Err("no spare yet".to_string())
            }
        })
        .await;
    };

    let residue = hooks("residue", Duration::from_secs(5));
    assert!(!residue.has_spare(), "none before a first call");
    residue::found(&call(residue.clone()).await.unwrap());
    spare_ready(residue.clone()).await;
    // Calls at once: one takes the spare, the others make their own; each finds nothing.
    let calls: Vec<_> = (0..4)
        .map(|_| tokio::spawn(call(residue.clone())))
        .collect();
    for (n, c) in calls.into_iter().enumerate() {
        let answer = c.await.unwrap().unwrap();
        assert_eq!(residue::found(&answer), 0, "call {n} at once");
    }
    for n in 0..3 {
        spare_ready(residue.clone()).await;
        let answer = call(residue.clone()).await.unwrap();
        assert_eq!(residue::found(&answer), 0, "call {n} in a spare");
    }

    // A trapped call's instance is dropped, never made the next call's spare.
    let panics = hooks("panic", Duration::from_secs(5));
    assert!(matches!(
        call(panics.clone()).await,
        Err(HookError::Failed(_))
    ));
    spare_ready(panics.clone()).await;
    assert!(matches!(
        call(panics.clone()).await,
        Err(HookError::Failed(_))
    ));

    // A spinning hook in a spare: stopped within its deadline all the same.
    let hang = hooks("hang", Duration::from_millis(300));
    assert!(matches!(
        call(hang.clone()).await,
        Err(HookError::Timeout(_))
    ));
    spare_ready(hang.clone()).await;
    assert!(matches!(
        call(hang.clone()).await,
        Err(HookError::Timeout(_))
    ));
    spare_ready(residue.clone()).await;
    let answer = call(residue).await.unwrap();
    assert_eq!(
        residue::found(&answer),
        0,
        "after the trap and the timeouts"
    );
}

/// More hook calls at once than the pool has slots: a call waits for a slot within its deadline,
/// and one whose deadline passes while every slot is taken fails with an error saying so; the
/// slot goes back when the call holding it ends, even by its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_call_without_a_free_slot_waits_then_says_so() {
    use wdp::hooks::HookError;
    use wdp::sandbox::HookPool;

    let (_f, sandbox, hooks) = hook_sandbox(HookPool { slots: 1 }).await;
    let hang = hooks("hang", Duration::from_secs(2));
    let echo = hooks("echo", Duration::from_millis(100));
    let call = call_hook;
    let holding = tokio::spawn(call(hang.clone()));
    let metrics = || sandbox.hook_engine().pooling_allocator_metrics().unwrap();
    // Its instance, and the spare its hook's thread made as it started.
    eventually_showing("the hanging call holds the one slot", || async {
        match (hang.has_spare(), metrics().component_instances()) {
            (true, 2) => Ok(()),
            (spare, n) => Err(format!("spare {spare}, {n} instances")),
        }
    })
    .await;
    match call(echo.clone()).await {
        Err(HookError::Busy { slots: 1, waited }) => {
            assert_eq!(waited, Duration::from_millis(100));
        }
        other => panic!("expected no free slot, got {other:?}"),
    }
    assert!(matches!(holding.await.unwrap(), Err(HookError::Timeout(_))));
    // The hanging call's instance is dropped (a call cut off by its deadline leaves no store);
    // its hook's spare holds a slot of the spares', never the one calls wait for.
    eventually_showing("the hanging call's instance dropped", || async {
        match (hang.has_spare(), metrics().component_instances()) {
            (true, 1) => Ok(()),
            (spare, n) => Err(format!("spare {spare}, {n} instances")),
        }
    })
    .await;
    assert!(call(echo).await.is_ok(), "the slot is free again");
}
