//! Guest hooks on kubelet's allocation calls: `post-allocate`, `get-preferred-allocation` and
//! `pre-start-container`.
//!
//! Each call runs in a fresh instance (instantiation from an `InstancePre` costs microseconds), so
//! no state leaks from one pod's allocation into the next and a trapped or timed-out call poisons
//! nothing. The instance's memory, tables and stack come from the hooks' pool, which resets them
//! when the instance is dropped (`sandbox::engine::hook_engine` says what is reset and why that
//! keeps every instance fresh), so a call maps and unmaps nothing; a call waits for a free slot
//! within its deadline ([`HookError::Busy`] when none comes).
//!
//! What a call would otherwise do on its critical path is done off it, by the hook's own thread
//! ([`tidier`]) as the next call starts, beside that call's run: the finished call's store is
//! dropped (the slot's reset) and a spare instance is made for the call after (a store, its WASI
//! context and the instantiation). A spare is as fresh as an instance made for the call: made
//! from the `InstancePre`, never entered before the one call that takes it, and never made from
//! a used instance; a call that finds no spare (the first, or one that overlaps another) makes
//! its own as before. A finished call's store is never entered again; until the next call
//! starts it holds its slot and the pages the call dirtied. Both it and the spare count as
//! waiting, not running, so an idle host's epoch ticker still parks.
//!
//! Every call has the scanner's `call-timeout` as its deadline, and `pre-start-container` at most
//! [`PRE_START_DEADLINE`]: kubelet gives PreStartContainer 30 s
//! (`KubeletPreStartContainerRPCTimeoutInSecs`) and fails the container when they pass, so the
//! hook must answer, even with an error, before that. Allocate and GetPreferredAllocation have no
//! deadline on kubelet's side.

mod tidier;

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use wasmtime::Store;
use wasmtime::component::Instance;

use crate::bindings::post_allocator::PostAllocatorPluginIndices;
use crate::bindings::pre_starter::PreStarterPluginIndices;
use crate::bindings::preferred_allocator::PreferredAllocatorPluginIndices;
use crate::bindings::types as wit;
use crate::metrics::Hook;
use crate::policy::Policy;
use crate::sandbox::{
    Guest, GuestState, LoadedComponent, Sandbox, SandboxError, Stopped, Waiting, describe,
};
use wdp_kubelet::api;

/// The longest a `pre-start-container` call may run: kubelet's 30 s deadline for the whole
/// PreStartContainer call, less room for instantiation, the gRPC round trip and a loaded node.
pub const PRE_START_DEADLINE: Duration = Duration::from_secs(25);

/// Why a hook call failed.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("no answer within {0:?}")]
    /// No answer within the deadline (or the CPU budget, which is as long).
    Timeout(std::time::Duration),
    #[error("the hook returned an error: {0}")]
    /// The hook answered with an error.
    Guest(String),
    #[error("{0}")]
    /// The instance failed: a trap, a limit, a missing export.
    Failed(String),
    #[error(
        "every one of the {slots} hook instance slots stayed taken for {waited:?}: too many hook calls at once"
    )]
    /// No slot of the hooks' pool came free within the call's deadline.
    Busy {
        /// The pool's size.
        slots: u32,
        /// How long the call waited.
        waited: Duration,
    },
}

/// The hooks one component exports, ready to call.
pub struct Hooks {
    guest: Guest,
    /// The rules its answers must follow.
    policy: Arc<Policy>,
    /// Where each call's instance comes from, and where it goes after.
    instances: Arc<Instances>,
    post: Option<PostAllocatorPluginIndices>,
    preferred: Option<PreferredAllocatorPluginIndices>,
    pre_start: Option<PreStarterPluginIndices>,
}

/// The instances of one hook component: each call gets a fresh one, the spare when one is ready
/// (made as the previous call ran, off the path of any call) or one made for it. After the call
/// its store waits, unused, until the next call starts; then the hook's thread drops it (which
/// resets its pool slot) and makes the next spare.
struct Instances {
    sandbox: Arc<Sandbox>,
    guest: Guest,
    /// Which engine (and so which pool) its instances come from.
    component: LoadedComponent,
    /// At most one spare; a call takes it out, so no two calls can be handed the same one.
    spare: Mutex<Option<Spare>>,
    /// The stores of the calls that ended since the last call started, for the thread to drop:
    /// one per call slot at most, as each holds its slot.
    used: Mutex<Vec<Used>>,
    /// The thread that drops them and makes spares, started by the first call. `None` for a
    /// component outside the pool, which has no spares (`Sandbox::spare_slot`), or if the system
    /// refused the thread: then stores are dropped on the call's path and no spare is made.
    tidier: OnceLock<Option<tidier::Tidier>>,
}

/// A fresh instance made ahead of the call that will take it: instantiated (its start functions,
/// if any, run under its CPU budget and the call's deadline) and never entered since.
struct Spare {
    /// Counts the spare as waiting, so the epoch ticker parks while it waits for its call.
    /// Declared before `store` so it is dropped first: the clock's count of running guests,
    /// which the store's guard adds to, never dips below zero.
    idle: Waiting,
    store: Store<GuestState>,
    instance: Instance,
    /// Its slot of the pool's spares; dropped after `store` (fields drop in order), as the
    /// instance gives its pool slot back when its store is dropped.
    slot: OwnedSemaphorePermit,
}

/// A finished call's store, never entered again, held only to be dropped by the thread.
struct Used {
    /// Counts the store as waiting (as a spare's); dropped first, for the same reason.
    _idle: Waiting,
    _store: Store<GuestState>,
    /// Its slot; given back after the store (fields drop in order), which resets the slot.
    _slot: OwnedSemaphorePermit,
}

/// The instance one call runs in: its store, the instance if made already (a spare), and the
/// pool slot it holds.
struct ForCall {
    store: Store<GuestState>,
    instance: Option<Instance>,
    slot: Option<OwnedSemaphorePermit>,
}

/// What one call's work hands back: its store (dropped off the call's path) and its answer.
type Answered<T> = (Store<GuestState>, wasmtime::Result<Result<T, String>>);

/// A configured hook component that exports none of the hook interfaces.
#[derive(Debug, thiserror::Error)]
#[error(
    "{path} exports no hook: expected post-allocator, preferred-allocator or pre-starter of wdp:device-plugin"
)]
pub struct NoHooks {
    /// The component.
    pub path: PathBuf,
}

impl Hooks {
    /// Finds the hook exports of `component` (loaded with [`Sandbox::load_hooks`]); at least one
    /// must exist. Its answers are checked against `policy`.
    pub fn new(
        sandbox: Arc<Sandbox>,
        guest: Guest,
        policy: Arc<Policy>,
        component: &LoadedComponent,
    ) -> Result<Self, NoHooks> {
        let pre = component.instance_pre();
        let tidier = if sandbox.is_pooled(component) {
            OnceLock::new()
        } else {
            OnceLock::from(None)
        };
        let hooks = Hooks {
            post: PostAllocatorPluginIndices::new(pre).ok(),
            preferred: PreferredAllocatorPluginIndices::new(pre).ok(),
            pre_start: PreStarterPluginIndices::new(pre).ok(),
            instances: Arc::new(Instances {
                sandbox,
                guest: guest.clone(),
                component: component.clone(),
                spare: Mutex::new(None),
                used: Mutex::new(Vec::new()),
                tidier,
            }),
            guest,
            policy,
        };
        if hooks.post.is_none() && hooks.preferred.is_none() && hooks.pre_start.is_none() {
            return Err(NoHooks {
                path: component.path().to_path_buf(),
            });
        }
        if hooks.pre_start.is_some() && hooks.guest.limits.call_timeout > PRE_START_DEADLINE {
            tracing::warn!(
                scanner = &*hooks.guest.name,
                call_timeout = ?hooks.guest.limits.call_timeout,
                pre_start_deadline = ?PRE_START_DEADLINE,
                "limits.call-timeout is longer than kubelet allows PreStartContainer (30 s): pre-start-container calls stop at the lower deadline"
            );
        }
        Ok(hooks)
    }

    /// What to advertise to kubelet.
    pub fn options(&self) -> api::DevicePluginOptions {
        api::DevicePluginOptions {
            pre_start_required: self.pre_start.is_some(),
            get_preferred_allocation_available: self.preferred.is_some(),
        }
    }

    /// Applies the scanner's policy to what `post-allocate` returned for container `index`.
    pub(crate) fn check_response(
        &self,
        index: usize,
        response: wit::ContainerAllocateResponse,
    ) -> Result<crate::allocate::ContainerResponse, crate::tree::OutputError> {
        self.policy
            .check_response(index, response, self.instances.sandbox.devfs())
    }

    /// True when the component exports `post-allocator`.
    pub fn has_post_allocate(&self) -> bool {
        self.post.is_some()
    }

    /// Runs `post-allocate`; `None` when the component does not export it.
    pub async fn post_allocate(
        &self,
        dev_type: &str,
        requests: &[wit::ContainerAllocateRequest],
        responses: &[wit::ContainerAllocateResponse],
    ) -> Option<Result<Vec<wit::ContainerAllocateResponse>, HookError>> {
        let exports = self.post.as_ref()?;
        Some(
            self.call(
                Hook::PostAllocate,
                self.deadline(),
                |mut store, instance| async move {
                    let answer = async {
                        exports
                            .load(&mut store, &instance)?
                            .wdp_device_plugin_post_allocator()
                            .call_post_allocate(&mut store, dev_type, requests, responses)
                            .await
                    }
                    .await;
                    (store, answer)
                },
            )
            .await,
        )
    }

    /// Runs `get-preferred-allocation`; `None` when not exported.
    pub async fn preferred_allocation(
        &self,
        dev_type: &str,
        requests: &[wit::ContainerPreferredAllocationRequest],
    ) -> Option<Result<Vec<Vec<String>>, HookError>> {
        let exports = self.preferred.as_ref()?;
        Some(
            self.call(
                Hook::GetPreferredAllocation,
                self.deadline(),
                |mut store, instance| async move {
                    let answer = async {
                        exports
                            .load(&mut store, &instance)?
                            .wdp_device_plugin_preferred_allocator()
                            .call_get_preferred_allocation(&mut store, dev_type, requests)
                            .await
                    }
                    .await;
                    (store, answer)
                },
            )
            .await,
        )
    }

    /// Runs `pre-start-container`; `None` when not exported.
    pub async fn pre_start(
        &self,
        dev_type: &str,
        device_ids: &[String],
    ) -> Option<Result<(), HookError>> {
        let exports = self.pre_start.as_ref()?;
        let deadline = self.deadline().min(PRE_START_DEADLINE);
        Some(
            self.call(
                Hook::PreStartContainer,
                deadline,
                |mut store, instance| async move {
                    let answer = async {
                        exports
                            .load(&mut store, &instance)?
                            .wdp_device_plugin_pre_starter()
                            .call_pre_start_container(&mut store, dev_type, device_ids)
                            .await
                    }
                    .await;
                    (store, answer)
                },
            )
            .await,
        )
    }

    /// The scanner's `call-timeout`.
    fn deadline(&self) -> Duration {
        self.guest.limits.call_timeout
    }

    /// One call of `hook` in a fresh instance, under `deadline`; timed into the scanner's
    /// metrics. `f` calls the export on the instance and hands the store back with the answer.
    async fn call<T, F, Fut>(&self, hook: Hook, deadline: Duration, f: F) -> Result<T, HookError>
    where
        F: FnOnce(Store<GuestState>, Instance) -> Fut,
        Fut: Future<Output = Answered<T>>,
    {
        let started = std::time::Instant::now();
        let result = self.call_once(deadline, f).await;
        self.guest.metrics.hook_called(hook, started.elapsed());
        result
    }

    async fn call_once<T, F, Fut>(&self, deadline: Duration, f: F) -> Result<T, HookError>
    where
        F: FnOnce(Store<GuestState>, Instance) -> Fut,
        Fut: Future<Output = Answered<T>>,
    {
        // The wait for a slot counts against the call's deadline: kubelet's does not stop.
        let waiting = std::time::Instant::now();
        let spare = self.instances.take_spare();
        // After the spare is taken, so the thread makes the next call's; before waiting for a
        // slot, which the stores it drops may be holding.
        self.instances.tidy();
        let ForCall {
            mut store,
            instance,
            slot,
        } = match spare {
            Some(spare) => spare,
            None => self.instances.for_call(deadline).await?,
        };
        let remaining = deadline.saturating_sub(waiting.elapsed());
        let pre = self.instances.component.instance_pre();
        let run = async move {
            let instance = match instance {
                Some(instance) => instance,
                None => match pre.instantiate_async(&mut store).await {
                    Ok(instance) => instance,
                    Err(e) => return (store, Err(e)),
                },
            };
            f(store, instance).await
        };
        // A `let` of its own: a call cut off by its deadline has its store (inside `run`)
        // dropped by the end of this statement, before `slot` can let another call take it.
        let outcome = tokio::time::timeout(remaining, run).await;
        let result = match outcome {
            Err(_) => {
                self.instances.after_call(None, slot);
                return Err(HookError::Timeout(deadline));
            }
            Ok((store, result)) => {
                self.instances.after_call(Some(store), slot);
                result
            }
        };
        match result {
            // The CPU budget is as long as the deadline: a hook that spins meets whichever
            // fires first, and either way it ran out of its time.
            Err(e) if matches!(e.downcast_ref::<Stopped>(), Some(Stopped::CpuBudget(_))) => {
                Err(HookError::Timeout(deadline))
            }
            Err(e) => Err(HookError::Failed(describe(&e))),
            Ok(Err(message)) => Err(HookError::Guest(message)),
            Ok(Ok(value)) => Ok(value),
        }
    }

    /// True while a spare instance waits for the next call: for tests.
    pub fn has_spare(&self) -> bool {
        self.instances.spare().is_some()
    }
}

impl Instances {
    fn spare(&self) -> std::sync::MutexGuard<'_, Option<Spare>> {
        // A panic while the lock was held left at worst no spare or an unused one: both fine.
        self.spare.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The spare, if one is ready, for the one call that takes it.
    fn take_spare(&self) -> Option<ForCall> {
        let Spare {
            idle,
            mut store,
            instance,
            slot,
        } = self.spare().take()?;
        // Running again: the epoch ticker wakes for it.
        drop(idle);
        // The call's CPU budget and epoch deadline count from now, not from when the spare was
        // made (the deadline is an epoch, which may have moved on since).
        store.data_mut().cpu.check_in();
        store.set_epoch_deadline(1);
        Some(ForCall {
            store,
            instance: Some(instance),
            slot: Some(slot),
        })
    }

    /// A fresh store for a call that found no spare, in a slot it waits for within `deadline`;
    /// the call instantiates in it.
    async fn for_call(&self, deadline: Duration) -> Result<ForCall, HookError> {
        let Ok(slot) =
            tokio::time::timeout(deadline, self.sandbox.hook_slot(&self.component)).await
        else {
            return Err(HookError::Busy {
                slots: self.sandbox.hook_pool().slots,
                waited: deadline,
            });
        };
        let store = self
            .sandbox
            .hook_store(&self.guest, &self.component)
            .map_err(|e: SandboxError| HookError::Failed(e.to_string()))?;
        Ok(ForCall {
            store,
            instance: None,
            slot,
        })
    }

    /// After a call: its store (if it outlived the call) waits with its slot for the next call's
    /// start ([`Instances::tidy`]), so the call answers first and the work is not done as its
    /// answer goes out. A store after a trap waits like any other: it is never entered again,
    /// never made a spare, and its slot is reset by wasmtime before anything takes it again.
    fn after_call(&self, store: Option<Store<GuestState>>, slot: Option<OwnedSemaphorePermit>) {
        match (store, slot, self.tidier()) {
            (Some(store), Some(slot), Some(_)) => self.used().push(Used {
                _idle: self.sandbox.clock().waiting(),
                _store: store,
                _slot: slot,
            }),
            // Only an instance of the pool waits: its slot bounds how many can. One outside the
            // pool (a hook that fits no slot) has nothing bounding them, so it is dropped here,
            // on the call's path, as is everything when the thread could not be started. The
            // store first: it gives its pool slot back as it is dropped.
            (store, slot, _) => {
                drop(store);
                drop(slot);
            }
        }
    }

    /// As a call starts: hands the thread the finished calls' stores to drop and the making of
    /// the next spare.
    fn tidy(self: &Arc<Self>) {
        let Some(tidier) = self.tidier() else {
            return;
        };
        let used = std::mem::take(&mut *self.used());
        let instances = self.clone();
        tidier.run(Box::new(move |runtime| {
            drop(used);
            runtime.block_on(instances.make_spare());
        }));
    }

    /// The hook's thread, started by the first call; `None` for the reasons the field gives.
    fn tidier(&self) -> Option<&tidier::Tidier> {
        self.tidier
            .get_or_init(|| match tidier::Tidier::start() {
                Ok(tidier) => Some(tidier),
                Err(error) => {
                    tracing::warn!(
                        scanner = &*self.guest.name,
                        %error,
                        "cannot start the hook's thread: its calls make their own instances and drop them on their path"
                    );
                    None
                }
            })
            .as_ref()
    }

    fn used(&self) -> std::sync::MutexGuard<'_, Vec<Used>> {
        // A panic while the lock was held left at worst a store not yet handed over: the next
        // call hands it over, or the component's drop drops it.
        self.used.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes a spare unless one is ready. Run only by the hook's thread, so one at a time.
    async fn make_spare(&self) {
        if self.spare().is_some() {
            return;
        }
        if let Some(spare) = self.new_spare().await {
            *self.spare() = Some(spare);
        }
    }

    /// A fresh instance in a slot of the pool's spares, if one is free. One that fails to
    /// instantiate is dropped: the next call instantiates afresh and reports why.
    async fn new_spare(&self) -> Option<Spare> {
        let slot = self.sandbox.spare_slot(&self.component)?;
        let mut store = self.sandbox.hook_store(&self.guest, &self.component).ok()?;
        let instantiating = self.component.instance_pre().instantiate_async(&mut store);
        let instance = tokio::time::timeout(self.guest.limits.call_timeout, instantiating)
            .await
            .ok()?
            .ok()?;
        Some(Spare {
            idle: self.sandbox.clock().waiting(),
            store,
            instance,
            slot,
        })
    }
}
