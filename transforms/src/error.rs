//! Errors of the transform host. Each names the transform, the module, the
//! partition or the record it is about, and what to do.

use rill_client::ClientError;

#[derive(Debug, thiserror::Error)]
pub enum TransformError {
    /// The module is not a valid transform component (wrong format, wrong world,
    /// a missing export or an import the host does not provide).
    #[error("invalid transform module: {0}")]
    InvalidModule(String),
    /// A deployment's settings cannot work (bad name, missing topic, ...).
    #[error("{0}")]
    Deployment(String),
    /// Instantiating or initialising the module failed.
    #[error("transform {name}: {message}")]
    Instance { name: String, message: String },
    /// A record in `__transforms` (or the status/log topics) could not be decoded.
    #[error("{0}")]
    Decode(String),
    #[error(transparent)]
    Client(#[from] ClientError),
}

impl TransformError {
    pub(crate) fn invalid(message: impl Into<String>) -> TransformError {
        TransformError::InvalidModule(message.into())
    }
}
