//! The API server calls the DRA front-end makes, behind two small traits so the plugin and the
//! publisher do not care who answers: [`client::ApiClient`] (HTTP to the real API server, or to
//! the stand-in) implements both.
//!
//! - [`ClaimSource`]: read a ResourceClaim (NodePrepareResources needs its allocation).
//! - [`SliceStore`]: the node's ResourceSlices of one driver (list, create, update with
//!   resourceVersion, delete).

pub mod client;
pub mod standin;

use std::future::Future;

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

/// Reads and writes the ResourceSlices of one node and driver.
pub trait SliceStore: Send + Sync + 'static {
    /// Every slice with `spec.nodeName == node` and `spec.driver == driver`.
    fn list(
        &self,
        node: &str,
        driver: &str,
    ) -> impl Future<Output = Result<Vec<ResourceSlice>, ApiError>> + Send;
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
