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
//! Every call has the scanner's `call-timeout` as its deadline, and `pre-start-container` at most
//! [`PRE_START_DEADLINE`]: kubelet gives PreStartContainer 30 s
//! (`KubeletPreStartContainerRPCTimeoutInSecs`) and fails the container when they pass, so the
//! hook must answer, even with an error, before that. Allocate and GetPreferredAllocation have no
//! deadline on kubelet's side.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use wasmtime::Store;

use crate::bindings::post_allocator::PostAllocatorPluginPre;
use crate::bindings::pre_starter::PreStarterPluginPre;
use crate::bindings::preferred_allocator::PreferredAllocatorPluginPre;
use crate::bindings::types as wit;
use crate::metrics::Hook;
use crate::policy::Policy;
use crate::sandbox::{
    Guest, GuestState, LoadedComponent, Sandbox, SandboxError, Stopped, describe,
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
    sandbox: Arc<Sandbox>,
    guest: Guest,
    /// The rules its answers must follow.
    policy: Arc<Policy>,
    /// Which engine (and so which pool) its instances come from.
    component: LoadedComponent,
    post: Option<PostAllocatorPluginPre<GuestState>>,
    preferred: Option<PreferredAllocatorPluginPre<GuestState>>,
    pre_start: Option<PreStarterPluginPre<GuestState>>,
}

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
        let hooks = Hooks {
            sandbox,
            guest,
            policy,
            component: component.clone(),
            post: component.post_allocator(),
            preferred: component.preferred_allocator(),
            pre_start: component.pre_starter(),
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
            .check_response(index, response, self.sandbox.devfs())
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
        let pre = self.post.as_ref()?;
        Some(
            self.call(
                Hook::PostAllocate,
                self.deadline(),
                |mut store| async move {
                    let hook = pre.instantiate_async(&mut store).await?;
                    hook.wdp_device_plugin_post_allocator()
                        .call_post_allocate(&mut store, dev_type, requests, responses)
                        .await
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
        let pre = self.preferred.as_ref()?;
        Some(
            self.call(
                Hook::GetPreferredAllocation,
                self.deadline(),
                |mut store| async move {
                    let hook = pre.instantiate_async(&mut store).await?;
                    hook.wdp_device_plugin_preferred_allocator()
                        .call_get_preferred_allocation(&mut store, dev_type, requests)
                        .await
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
        let pre = self.pre_start.as_ref()?;
        let deadline = self.deadline().min(PRE_START_DEADLINE);
        Some(
            self.call(Hook::PreStartContainer, deadline, |mut store| async move {
                let hook = pre.instantiate_async(&mut store).await?;
                hook.wdp_device_plugin_pre_starter()
                    .call_pre_start_container(&mut store, dev_type, device_ids)
                    .await
            })
            .await,
        )
    }

    /// The scanner's `call-timeout`.
    fn deadline(&self) -> Duration {
        self.guest.limits.call_timeout
    }

    /// One call of `hook` in a fresh store, under `deadline`; timed into the scanner's metrics.
    async fn call<T, F, Fut>(&self, hook: Hook, deadline: Duration, f: F) -> Result<T, HookError>
    where
        F: FnOnce(Store<GuestState>) -> Fut,
        Fut: Future<Output = wasmtime::Result<Result<T, String>>>,
    {
        let started = std::time::Instant::now();
        let result = self.call_once(deadline, f).await;
        self.guest.metrics.hook_called(hook, started.elapsed());
        result
    }

    async fn call_once<T, F, Fut>(&self, deadline: Duration, f: F) -> Result<T, HookError>
    where
        F: FnOnce(Store<GuestState>) -> Fut,
        Fut: Future<Output = wasmtime::Result<Result<T, String>>>,
    {
        // The wait for a slot counts against the call's deadline: kubelet's does not stop.
        let waiting = std::time::Instant::now();
        let Ok(slot) =
            tokio::time::timeout(deadline, self.sandbox.hook_slot(&self.component)).await
        else {
            return Err(HookError::Busy {
                slots: self.sandbox.hook_pool().slots,
                waited: deadline,
            });
        };
        let remaining = deadline.saturating_sub(waiting.elapsed());
        let store = self
            .sandbox
            .hook_store(&self.guest, &self.component)
            .map_err(|e: SandboxError| HookError::Failed(e.to_string()))?;
        // The store (and with it the instance and its pool slot) is dropped by the end of this
        // `match`, before `slot` lets another call take the slot.
        let _slot = slot;
        match tokio::time::timeout(remaining, f(store)).await {
            Err(_) => Err(HookError::Timeout(deadline)),
            // The CPU budget is as long as the deadline: a hook that spins meets whichever
            // fires first, and either way it ran out of its time.
            Ok(Err(e)) if matches!(e.downcast_ref::<Stopped>(), Some(Stopped::CpuBudget(_))) => {
                Err(HookError::Timeout(deadline))
            }
            Ok(Err(e)) => Err(HookError::Failed(describe(&e))),
            Ok(Ok(Err(message))) => Err(HookError::Guest(message)),
            Ok(Ok(Ok(value))) => Ok(value),
        }
    }
}
