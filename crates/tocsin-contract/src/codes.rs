//! Error codes as the wire names them: the gRPC code's name in
//! `ErrorInfo.code` and in the HTTP error body, the HTTP status each maps
//! to, and the `ErrorInfo` a gRPC status carries in its details.

use prost::Message;
use tocsin_proto::v1 as pb;

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

/// `ErrorInfo.reason` of a create refused because its id holds a finished
/// timer with the same spec (FAILED_PRECONDITION).
pub const TIMER_FINISHED: &str = "TIMER_FINISHED";

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_name_reads_back() {
        for n in 0..17 {
            let code = tonic::Code::from(n);
            assert_eq!(code_from_name(code_name(code)), code);
        }
        assert_eq!(code_from_name("NO_SUCH_CODE"), tonic::Code::Internal);
    }

    #[test]
    fn a_status_without_details_still_has_an_info() {
        let status = tonic::Status::unavailable("gone");
        let info = info_of(&status);
        assert_eq!((info.code.as_str(), info.message.as_str()), ("UNAVAILABLE", "gone"));
    }
}
