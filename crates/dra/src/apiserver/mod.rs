//! The API server calls the DRA front-end makes, behind two small traits so the plugin and the
//! publisher do not care who answers: [`client::ApiClient`] (HTTP to the real API server, or to
//! the stand-in) implements both.
//!
//! - [`ClaimSource`]: read a ResourceClaim (NodePrepareResources needs its allocation).
//! - [`SliceStore`]: the node's ResourceSlices of one driver (list, create, update with
//!   resourceVersion, delete, watch).
//!
//! [`watch::SliceWatcher`] turns the store's list and watch into one endless sequence of
//! observations: it resumes a watch that ended from the last resourceVersion it saw (an event's
//! or a bookmark's) and lists afresh when the API server answers 410 Gone.

pub mod client;
pub mod kubeconfig;
pub mod standin;
pub mod watch;

use std::future::Future;
use std::pin::Pin;

use futures::Stream;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};

/// Why an API call failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The object changed since it was read (HTTP 409 with reason Conflict) or already exists
    /// (409 AlreadyExists): read again and retry.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The object does not exist (HTTP 404).
    #[error("not found: {0}")]
    NotFound(String),
    /// The resourceVersion a watch asked to start from is older than the history the API server
    /// keeps (HTTP 410, or a watch `ERROR` event with code 410): list again, then watch from the
    /// list's resourceVersion.
    #[error("gone: {0}")]
    Gone(String),
    /// Any other answer that is not a success, with its status code and message.
    #[error("API server answered {code}: {message}")]
    Status {
        /// The HTTP status code.
        code: u16,
        /// The Status message, or the body.
        message: String,
    },
    /// No answer: connecting, TLS or HTTP failed.
    #[error("API server unreachable: {0}")]
    Transport(String),
    /// The answer was not the JSON expected.
    #[error("API server answer not understood: {0}")]
    Decode(#[from] serde_json::Error),
    /// The client could not be configured (in-cluster files or environment missing).
    #[error("API client configuration: {0}")]
    Config(String),
    /// The kubeconfig named cannot be used.
    #[error(transparent)]
    Kubeconfig(#[from] kubeconfig::KubeconfigError),
}

/// Reads ResourceClaims.
pub trait ClaimSource: Send + Sync + 'static {
    /// The claim `namespace/name`, or `None` when there is none.
    fn get_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<ResourceClaim>, ApiError>> + Send;
}

/// One change a watch reports, in the API server's order.
#[derive(Clone, Debug, PartialEq)]
pub enum WatchEvent {
    /// A slice was created.
    Added(ResourceSlice),
    /// A slice was replaced.
    Modified(ResourceSlice),
    /// A slice was deleted (its last state, at the deletion's resourceVersion).
    Deleted(ResourceSlice),
    /// No change to the watched slices, but the collection reached this resourceVersion: a
    /// watch resumed from it misses nothing, and it is newer than the last event's, so it is
    /// less likely to be 410 Gone.
    Bookmark(String),
}

impl WatchEvent {
    /// The resourceVersion to resume a watch from after this event.
    pub fn resource_version(&self) -> Option<&str> {
        match self {
            Self::Added(s) | Self::Modified(s) | Self::Deleted(s) => {
                s.metadata.resource_version.as_deref()
            }
            Self::Bookmark(v) => Some(v),
        }
    }
}

/// The events of one watch request, until the API server ends it (its `timeoutSeconds`) or it
/// fails; [`watch::SliceWatcher`] starts the next.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, ApiError>> + Send>>;

/// A list answer: the items and the collection's resourceVersion, where a watch that follows it
/// starts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SliceList {
    /// The slices selected.
    pub items: Vec<ResourceSlice>,
    /// The list's `metadata.resourceVersion`.
    pub resource_version: String,
}

/// Reads and writes the ResourceSlices of one node and driver.
pub trait SliceStore: Send + Sync + 'static {
    /// Every slice with `spec.nodeName == node` and `spec.driver == driver`.
    fn list(
        &self,
        node: &str,
        driver: &str,
    ) -> impl Future<Output = Result<Vec<ResourceSlice>, ApiError>> + Send;
    /// Like [`SliceStore::list`], with the list's resourceVersion (where a watch starts).
    fn list_at(
        &self,
        node: &str,
        driver: &str,
    ) -> impl Future<Output = Result<SliceList, ApiError>> + Send;
    /// The changes to the same slices after `resource_version`, as they happen;
    /// [`ApiError::Gone`] when that version is older than the API server's history.
    fn watch(
        &self,
        node: &str,
        driver: &str,
        resource_version: &str,
    ) -> impl Future<Output = Result<WatchStream, ApiError>> + Send;
    /// Creates `slice`; [`ApiError::Conflict`] when its name is taken.
    fn create(
        &self,
        slice: &ResourceSlice,
    ) -> impl Future<Output = Result<ResourceSlice, ApiError>> + Send;
    /// Replaces `slice`, whose `metadata.resourceVersion` must be the stored one
    /// ([`ApiError::Conflict`] otherwise).
    fn update(
        &self,
        slice: &ResourceSlice,
    ) -> impl Future<Output = Result<ResourceSlice, ApiError>> + Send;
    /// Deletes the slice `name`; [`ApiError::NotFound`] when it is already gone.
    fn delete(&self, name: &str) -> impl Future<Output = Result<(), ApiError>> + Send;
}
