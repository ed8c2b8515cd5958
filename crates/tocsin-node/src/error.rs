//! The node's errors: [`NodeError`], everything a request can fail with in
//! any layer, with its wire form (a gRPC status whose details are a
//! standard `google.rpc.Status`, see `tocsin_contract::codes`; the HTTP form
//! is the API layer's), and
//! [`StartError`], why a node could not start. Each request error tells a
//! client what it needs to retry: the field at fault, the leader to go to,
//! or how long to wait. The code names are the contract's
//! (`tocsin_contract::codes`).

use tocsin_core::ValidationError;
use tocsin_proto::v1 as pb;

/// Everything a request can fail with.
#[derive(Clone, Debug, thiserror::Error)]
pub enum NodeError {
    #[error("{field}: {message}")]
    InvalidArgument { field: String, message: String },
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
    /// A create found a finished timer with the same spec under its id
    /// (FAILED_PRECONDITION, reason `TIMER_FINISHED`).
    #[error("{0}")]
    TimerFinished(String),
    #[error("{message}")]
    ResourceExhausted { message: String, retry_after_ms: u64 },
    /// No usable leader here; `leader` says where to go if known.
    #[error("{message}")]
    Unavailable { message: String, leader: Option<pb::LeaderHint>, retry_after_ms: u64 },
    /// The request was routed by a cluster map older than the shard's last
    /// placement change; `map_epoch` is this node's. ABORTED on the wire:
    /// refresh the map, then retry.
    #[error("{message}")]
    StaleMap { message: String, map_epoch: u64 },
    #[error("{0}")]
    Internal(String),
    /// No token, or one the cluster does not know (never says which).
    #[error("{0}")]
    Unauthenticated(String),
    /// A known token whose scopes do not cover the call.
    #[error("{0}")]
    PermissionDenied(String),
}

impl From<ValidationError> for NodeError {
    fn from(e: ValidationError) -> Self {
        NodeError::InvalidArgument { field: e.field, message: e.message }
    }
}

impl NodeError {
    pub fn invalid(field: &str, message: impl Into<String>) -> NodeError {
        NodeError::InvalidArgument { field: field.into(), message: message.into() }
    }

    /// UNAVAILABLE with no leader to point at: retry after `retry_after_ms`.
    pub fn unavailable(message: impl Into<String>, retry_after_ms: u64) -> NodeError {
        NodeError::Unavailable { message: message.into(), leader: None, retry_after_ms }
    }

    pub fn code(&self) -> tonic::Code {
        match self {
            NodeError::InvalidArgument { .. } => tonic::Code::InvalidArgument,
            NodeError::NotFound(_) => tonic::Code::NotFound,
            NodeError::AlreadyExists(_) => tonic::Code::AlreadyExists,
            NodeError::FailedPrecondition(_) | NodeError::TimerFinished(_) => tonic::Code::FailedPrecondition,
            NodeError::ResourceExhausted { .. } => tonic::Code::ResourceExhausted,
            NodeError::Unavailable { .. } => tonic::Code::Unavailable,
            NodeError::StaleMap { .. } => tonic::Code::Aborted,
            NodeError::Internal(_) => tonic::Code::Internal,
            NodeError::Unauthenticated(_) => tonic::Code::Unauthenticated,
            NodeError::PermissionDenied(_) => tonic::Code::PermissionDenied,
        }
    }

    pub fn info(&self) -> pb::ErrorInfo {
        let mut info = pb::ErrorInfo {
            code: tocsin_contract::codes::code_name(self.code()).to_string(),
            message: self.to_string(),
            ..Default::default()
        };
        match self {
            NodeError::InvalidArgument { field, message } => {
                info.field = field.clone();
                info.message = format!("{field}: {message}");
            }
            NodeError::ResourceExhausted { retry_after_ms, .. } => info.retry_after_ms = *retry_after_ms,
            NodeError::Unavailable { leader, retry_after_ms, .. } => {
                info.leader = leader.clone();
                info.retry_after_ms = *retry_after_ms;
            }
            NodeError::StaleMap { map_epoch, .. } => info.map_epoch = *map_epoch,
            NodeError::TimerFinished(_) => info.reason = tocsin_contract::codes::TIMER_FINISHED.into(),
            _ => {}
        }
        info
    }
}

impl From<NodeError> for tonic::Status {
    fn from(e: NodeError) -> Self {
        tocsin_contract::codes::status_of(e.code(), &e.info())
    }
}

impl NodeError {
    /// The error another node answered with, as this node passes it on.
    pub fn from_status(status: &tonic::Status) -> NodeError {
        NodeError::from_info(status.code(), tocsin_contract::codes::info_of(status))
    }

    /// The error an `ErrorInfo` with `code` describes.
    pub fn from_info(code: tonic::Code, info: pb::ErrorInfo) -> NodeError {
        let message = info.message;
        match code {
            tonic::Code::InvalidArgument => NodeError::InvalidArgument {
                field: info.field.clone(),
                message: message.strip_prefix(&format!("{}: ", info.field)).unwrap_or(&message).to_string(),
            },
            tonic::Code::NotFound => NodeError::NotFound(message),
            tonic::Code::AlreadyExists => NodeError::AlreadyExists(message),
            tonic::Code::FailedPrecondition if info.reason == tocsin_contract::codes::TIMER_FINISHED => {
                NodeError::TimerFinished(message)
            }
            tonic::Code::FailedPrecondition => NodeError::FailedPrecondition(message),
            tonic::Code::ResourceExhausted => {
                NodeError::ResourceExhausted { message, retry_after_ms: info.retry_after_ms }
            }
            tonic::Code::Aborted => NodeError::StaleMap { message, map_epoch: info.map_epoch },
            tonic::Code::Unauthenticated => NodeError::Unauthenticated(message),
            tonic::Code::PermissionDenied => NodeError::PermissionDenied(message),
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
                NodeError::Unavailable { message, leader: info.leader, retry_after_ms: info.retry_after_ms }
            }
            _ => NodeError::Internal(message),
        }
    }
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("binding {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("opening the store at {path}: {source}")]
    Store { path: String, source: std::io::Error },
    #[error("starting raft group {group}: {message}")]
    Raft { group: u64, message: String },
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    #[error("building the webhook client: {0}")]
    Webhook(String),
    #[error("starting a runtime (Raft or fire): {0}")]
    Runtime(std::io::Error),
    #[error("{0}")]
    PeerTls(#[from] crate::peer_tls::PeerTlsError),
    #[error("{0}")]
    ClientTls(#[from] crate::client_tls::ClientTlsError),
}
