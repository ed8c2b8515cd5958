//! The API's errors, and their wire forms: a gRPC status whose details
//! carry an encoded `ErrorInfo`, or an HTTP status with a JSON body. Each
//! error tells a client what it needs to retry: the field at fault, the
//! leader to go to, or how long to wait.

use prost::Message;
use tocsin_core::ValidationError;
use tocsin_proto::v1 as pb;

use crate::proposer::ProposeError;

/// Everything a request can fail with.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{field}: {message}")]
    InvalidArgument { field: String, message: String },
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
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
}

impl From<ValidationError> for ApiError {
    fn from(e: ValidationError) -> Self {
        ApiError::InvalidArgument { field: e.field, message: e.message }
    }
}

impl ApiError {
    pub fn invalid(field: &str, message: impl Into<String>) -> ApiError {
        ApiError::InvalidArgument { field: field.into(), message: message.into() }
    }

    /// UNAVAILABLE with no leader to point at: retry after `retry_after_ms`.
    pub fn unavailable(message: impl Into<String>, retry_after_ms: u64) -> ApiError {
        ApiError::Unavailable { message: message.into(), leader: None, retry_after_ms }
    }

    /// Maps a failed proposal on `shard`.
    pub fn from_propose(shard: u32, e: ProposeError) -> ApiError {
        let hint = |leader: Option<(u64, tocsin_store::NodeAddr)>| {
            leader.map(|(id, addr)| pb::LeaderHint {
                shard,
                node_id: id,
                grpc_addr: addr.grpc_addr,
                http_addr: addr.http_addr,
            })
        };
        match e {
            ProposeError::NotLeader { leader } => ApiError::Unavailable {
                message: format!("this node does not lead shard {shard}"),
                leader: hint(leader),
                retry_after_ms: 50,
            },
            ProposeError::Discarded { leader } => ApiError::Unavailable {
                message: format!("leadership of shard {shard} changed; the outcome is unknown, retry with the same id"),
                leader: hint(leader),
                retry_after_ms: 50,
            },
            ProposeError::NoQuorum => ApiError::Unavailable {
                message: format!("this node's leadership of shard {shard} lost its quorum; try another node"),
                leader: None,
                retry_after_ms: 100,
            },
            ProposeError::Overloaded { retry_after } => ApiError::ResourceExhausted {
                message: format!(
                    "shard {shard} is overloaded: its queue's oldest command has waited {} ms",
                    retry_after.as_millis()
                ),
                retry_after_ms: retry_after.as_millis() as u64,
            },
            ProposeError::Timeout => ApiError::Unavailable {
                message: format!(
                    "shard {shard} did not answer in time; the outcome is unknown, retry with the same id"
                ),
                leader: None,
                retry_after_ms: 200,
            },
            ProposeError::Fatal(m) => ApiError::Unavailable {
                message: format!("shard {shard} is not serving: {m}"),
                leader: None,
                retry_after_ms: 1000,
            },
        }
    }

    pub fn code(&self) -> tonic::Code {
        match self {
            ApiError::InvalidArgument { .. } => tonic::Code::InvalidArgument,
            ApiError::NotFound(_) => tonic::Code::NotFound,
            ApiError::AlreadyExists(_) => tonic::Code::AlreadyExists,
            ApiError::FailedPrecondition(_) => tonic::Code::FailedPrecondition,
            ApiError::ResourceExhausted { .. } => tonic::Code::ResourceExhausted,
            ApiError::Unavailable { .. } => tonic::Code::Unavailable,
            ApiError::StaleMap { .. } => tonic::Code::Aborted,
            ApiError::Internal(_) => tonic::Code::Internal,
        }
    }

    pub fn info(&self) -> pb::ErrorInfo {
        let mut info =
            pb::ErrorInfo { code: code_name(self.code()).to_string(), message: self.to_string(), ..Default::default() };
        match self {
            ApiError::InvalidArgument { field, message } => {
                info.field = field.clone();
                info.message = format!("{field}: {message}");
            }
            ApiError::ResourceExhausted { retry_after_ms, .. } => info.retry_after_ms = *retry_after_ms,
            ApiError::Unavailable { leader, retry_after_ms, .. } => {
                info.leader = leader.clone();
                info.retry_after_ms = *retry_after_ms;
            }
            ApiError::StaleMap { map_epoch, .. } => info.map_epoch = *map_epoch,
            _ => {}
        }
        info
    }
}

impl From<ApiError> for tonic::Status {
    fn from(e: ApiError) -> Self {
        let info = e.info();
        tonic::Status::with_details(e.code(), info.message.clone(), info.encode_to_vec().into())
    }
}

impl ApiError {
    /// The error another node answered with, as this node passes it on.
    pub fn from_status(status: &tonic::Status) -> ApiError {
        ApiError::from_info(status.code(), info_of(status))
    }

    /// The error an `ErrorInfo` with `code` describes.
    pub fn from_info(code: tonic::Code, info: pb::ErrorInfo) -> ApiError {
        let message = info.message;
        match code {
            tonic::Code::InvalidArgument => ApiError::InvalidArgument {
                field: info.field.clone(),
                message: message.strip_prefix(&format!("{}: ", info.field)).unwrap_or(&message).to_string(),
            },
            tonic::Code::NotFound => ApiError::NotFound(message),
            tonic::Code::AlreadyExists => ApiError::AlreadyExists(message),
            tonic::Code::FailedPrecondition => ApiError::FailedPrecondition(message),
            tonic::Code::ResourceExhausted => {
                ApiError::ResourceExhausted { message, retry_after_ms: info.retry_after_ms }
            }
            tonic::Code::Aborted => ApiError::StaleMap { message, map_epoch: info.map_epoch },
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
                ApiError::Unavailable { message, leader: info.leader, retry_after_ms: info.retry_after_ms }
            }
            _ => ApiError::Internal(message),
        }
    }
}

/// The `ErrorInfo` in a status's details, or one made from its code and
/// message.
pub fn info_of(status: &tonic::Status) -> pb::ErrorInfo {
    pb::ErrorInfo::decode(status.details()).ok().filter(|i| !i.code.is_empty()).unwrap_or_else(|| pb::ErrorInfo {
        code: code_name(status.code()).to_string(),
        message: status.message().to_string(),
        ..Default::default()
    })
}

/// The code an `ErrorInfo.code` names (INTERNAL for a name it does not
/// know).
pub fn code_from_name(name: &str) -> tonic::Code {
    const ALL: [tonic::Code; 17] = [
        tonic::Code::Ok,
        tonic::Code::Cancelled,
        tonic::Code::Unknown,
        tonic::Code::InvalidArgument,
        tonic::Code::DeadlineExceeded,
        tonic::Code::NotFound,
        tonic::Code::AlreadyExists,
        tonic::Code::PermissionDenied,
        tonic::Code::ResourceExhausted,
        tonic::Code::FailedPrecondition,
        tonic::Code::Aborted,
        tonic::Code::OutOfRange,
        tonic::Code::Unimplemented,
        tonic::Code::Internal,
        tonic::Code::Unavailable,
        tonic::Code::DataLoss,
        tonic::Code::Unauthenticated,
    ];
    ALL.into_iter().find(|c| code_name(*c) == name).unwrap_or(tonic::Code::Internal)
}

pub fn code_name(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::Ok => "OK",
        tonic::Code::Cancelled => "CANCELLED",
        tonic::Code::Unknown => "UNKNOWN",
        tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
        tonic::Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        tonic::Code::NotFound => "NOT_FOUND",
        tonic::Code::AlreadyExists => "ALREADY_EXISTS",
        tonic::Code::PermissionDenied => "PERMISSION_DENIED",
        tonic::Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        tonic::Code::FailedPrecondition => "FAILED_PRECONDITION",
        tonic::Code::Aborted => "ABORTED",
        tonic::Code::OutOfRange => "OUT_OF_RANGE",
        tonic::Code::Unimplemented => "UNIMPLEMENTED",
        tonic::Code::Internal => "INTERNAL",
        tonic::Code::Unavailable => "UNAVAILABLE",
        tonic::Code::DataLoss => "DATA_LOSS",
        tonic::Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The HTTP status for a gRPC code.
pub fn http_status(code: tonic::Code) -> http::StatusCode {
    use http::StatusCode as S;
    match code {
        tonic::Code::Ok => S::OK,
        tonic::Code::InvalidArgument | tonic::Code::OutOfRange => S::BAD_REQUEST,
        tonic::Code::NotFound => S::NOT_FOUND,
        tonic::Code::AlreadyExists | tonic::Code::Aborted => S::CONFLICT,
        tonic::Code::FailedPrecondition => S::PRECONDITION_FAILED,
        tonic::Code::ResourceExhausted => S::TOO_MANY_REQUESTS,
        tonic::Code::Unavailable => S::SERVICE_UNAVAILABLE,
        tonic::Code::DeadlineExceeded => S::GATEWAY_TIMEOUT,
        tonic::Code::Unimplemented => S::NOT_IMPLEMENTED,
        tonic::Code::PermissionDenied => S::FORBIDDEN,
        tonic::Code::Unauthenticated => S::UNAUTHORIZED,
        _ => S::INTERNAL_SERVER_ERROR,
    }
}
