//! `Registration.Register`: announcing one resource to kubelet.

use std::path::Path;
use std::time::Duration;

use super::api::registration_client::RegistrationClient;
use super::api::{DevicePluginOptions, RegisterRequest};
use super::transport;

/// kubelet answers Register only after dialling the plugin back and asking its options.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a registration did not go through.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("cannot connect to kubelet at {path}: {error}")]
    /// kubelet's socket could not be reached.
    Connect {
        /// kubelet's socket.
        path: String,
        /// The transport's error.
        error: tonic::transport::Error,
    },
    #[error("kubelet refused {resource}: {status}")]
    /// kubelet refused the registration.
    Refused {
        /// The resource, `<namespace>/<dev-type>`.
        resource: String,
        /// kubelet's answer.
        status: tonic::Status,
    },
    #[error("kubelet did not answer within {REGISTER_TIMEOUT:?}")]
    /// kubelet did not answer in time.
    Timeout,
}

/// Registers `resource` (served on the socket file `endpoint` in kubelet's plugin directory).
pub async fn register(
    kubelet_socket: &Path,
    endpoint: &str,
    resource: &str,
    options: DevicePluginOptions,
) -> Result<(), RegisterError> {
    let attempt = async {
        let channel =
            transport::connect(kubelet_socket)
                .await
                .map_err(|error| RegisterError::Connect {
                    path: kubelet_socket.display().to_string(),
                    error,
                })?;
        RegistrationClient::new(channel)
            .register(RegisterRequest {
                version: super::API_VERSION.into(),
                endpoint: endpoint.into(),
                resource_name: resource.into(),
                options: Some(options),
            })
            .await
            .map_err(|status| RegisterError::Refused {
                resource: resource.into(),
                status,
            })?;
        Ok(())
    };
    tokio::time::timeout(REGISTER_TIMEOUT, attempt)
        .await
        .map_err(|_| RegisterError::Timeout)?
}
