//! Error codes as the wire names them: the gRPC code's name in
//! `ErrorInfo.code` and in the HTTP error body, the HTTP status each maps
//! to, and the details a failed gRPC status carries.
//!
//! A status's details are a standard `google.rpc.Status` (what grpcio's
//! `rpc_status`, grpc-go's `status.FromError` and tonic-types read), holding:
//! `google.rpc.ErrorInfo` (reason, domain `tocsin`, the retry facts as
//! metadata), `google.rpc.BadRequest` with the field at fault,
//! `google.rpc.RetryInfo` when a retry makes sense after a delay, and
//! Tocsin's own `tocsin.v1.ErrorInfo` with the same facts typed (the leader
//! hint as a message). Clients in any language read the standard three;
//! Tocsin's client reads its own.

use prost::Message;
use tocsin_proto::v1 as pb;
use tonic_types::pb as rpc;

/// `google.rpc.ErrorInfo.domain` of every error a node answers.
pub const ERROR_DOMAIN: &str = "tocsin";

/// The `Any` type URL of Tocsin's own `ErrorInfo` among a status's details.
pub const TOCSIN_ERROR_INFO_TYPE_URL: &str = "type.googleapis.com/tocsin.v1.ErrorInfo";

fn any<M: Message>(type_url: &str, m: &M) -> prost_types::Any {
    prost_types::Any { type_url: type_url.to_string(), value: m.encode_to_vec() }
}

/// The failed status for `info`: its code, its message, and the details
/// described above.
pub fn status_of(code: tonic::Code, info: &pb::ErrorInfo) -> tonic::Status {
    tonic::Status::with_details(code, info.message.clone(), rpc_status_of(code, info).encode_to_vec().into())
}

/// The `google.rpc.Status` a failed status carries as its details.
pub fn rpc_status_of(code: tonic::Code, info: &pb::ErrorInfo) -> rpc::Status {
    let mut metadata = std::collections::HashMap::new();
    metadata.insert("code".to_string(), code_name(code).to_string());
    if !info.field.is_empty() {
        metadata.insert("field".to_string(), info.field.clone());
    }
    if let Some(leader) = &info.leader {
        metadata.insert("leader_shard".to_string(), leader.shard.to_string());
        if leader.node_id != 0 {
            metadata.insert("leader_node_id".to_string(), leader.node_id.to_string());
        }
        if !leader.grpc_addr.is_empty() {
            metadata.insert("leader_grpc_addr".to_string(), leader.grpc_addr.clone());
        }
        if !leader.http_addr.is_empty() {
            metadata.insert("leader_http_addr".to_string(), leader.http_addr.clone());
        }
    }
    if info.map_epoch != 0 {
        metadata.insert("map_epoch".to_string(), info.map_epoch.to_string());
    }
    if info.retry_after_ms != 0 {
        metadata.insert("retry_after_ms".to_string(), info.retry_after_ms.to_string());
    }
    let reason = if info.reason.is_empty() { code_name(code).to_string() } else { info.reason.clone() };
    let mut details = vec![any(
        tonic_types::ErrorInfo::TYPE_URL,
        &rpc::ErrorInfo { reason, domain: ERROR_DOMAIN.to_string(), metadata },
    )];
    if !info.field.is_empty() {
        let description = info.message.strip_prefix(&format!("{}: ", info.field)).unwrap_or(&info.message);
        details.push(any(
            tonic_types::BadRequest::TYPE_URL,
            &rpc::BadRequest {
                field_violations: vec![rpc::bad_request::FieldViolation {
                    field: info.field.clone(),
                    description: description.to_string(),
                    ..Default::default()
                }],
            },
        ));
    }
    if info.retry_after_ms != 0 {
        let delay = std::time::Duration::from_millis(info.retry_after_ms);
        details.push(any(
            tonic_types::RetryInfo::TYPE_URL,
            &rpc::RetryInfo {
                retry_delay: Some(prost_types::Duration {
                    seconds: delay.as_secs() as i64,
                    nanos: delay.subsec_nanos() as i32,
                }),
            },
        ));
    }
    details.push(any(TOCSIN_ERROR_INFO_TYPE_URL, info));
    rpc::Status { code: code as i32, message: info.message.clone(), details }
}

/// Tocsin's `ErrorInfo` in a status's details, or one made from its code and
/// message (a status from a proxy, or from tonic itself). Details that are a
/// bare `tocsin.v1.ErrorInfo`, as nodes before the standard details sent
/// them, are read too, so a cluster can be upgraded one node at a time.
pub fn info_of(status: &tonic::Status) -> pb::ErrorInfo {
    let from_rpc_status = rpc::Status::decode(status.details()).ok().and_then(|s| {
        s.details
            .iter()
            .find(|a| a.type_url == TOCSIN_ERROR_INFO_TYPE_URL)
            .and_then(|a| pb::ErrorInfo::decode(a.value.as_slice()).ok())
    });
    from_rpc_status
        .or_else(|| pb::ErrorInfo::decode(status.details()).ok())
        .filter(|i| !i.code.is_empty())
        .unwrap_or_else(|| pb::ErrorInfo {
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

    fn sample() -> pb::ErrorInfo {
        pb::ErrorInfo {
            code: "UNAVAILABLE".into(),
            message: "not the leader of shard 3".into(),
            leader: Some(pb::LeaderHint {
                shard: 3,
                node_id: 2,
                grpc_addr: "10.0.0.2:7070".into(),
                http_addr: "10.0.0.2:7071".into(),
            }),
            retry_after_ms: 1_500,
            ..Default::default()
        }
    }

    #[test]
    fn a_status_carries_the_standard_details_and_tocsins_own() {
        use tonic_types::StatusExt;
        let status = status_of(tonic::Code::Unavailable, &sample());
        // The standard details, as any gRPC library's rich-error reader sees them.
        let details = status.check_error_details().expect("details are a google.rpc.Status");
        let error_info = details.error_info().expect("google.rpc.ErrorInfo");
        assert_eq!((error_info.reason.as_str(), error_info.domain.as_str()), ("UNAVAILABLE", ERROR_DOMAIN));
        assert_eq!(error_info.metadata.get("leader_grpc_addr").map(String::as_str), Some("10.0.0.2:7070"));
        assert_eq!(error_info.metadata.get("leader_node_id").map(String::as_str), Some("2"));
        assert_eq!(details.retry_info().and_then(|r| r.retry_delay), Some(std::time::Duration::from_millis(1_500)));
        assert!(details.bad_request().is_none(), "no field is at fault");
        // Tocsin's own, typed.
        assert_eq!(info_of(&status), sample());
    }

    #[test]
    fn an_invalid_argument_names_its_field_as_a_bad_request() {
        use tonic_types::StatusExt;
        let info = pb::ErrorInfo {
            code: "INVALID_ARGUMENT".into(),
            message: "fire_at_ms: is 5000 ms in the past".into(),
            field: "fire_at_ms".into(),
            ..Default::default()
        };
        let status = status_of(tonic::Code::InvalidArgument, &info);
        let violations = status.get_details_bad_request().expect("BadRequest").field_violations;
        assert_eq!(violations.len(), 1);
        assert_eq!(
            (violations[0].field.as_str(), violations[0].description.as_str()),
            ("fire_at_ms", "is 5000 ms in the past")
        );
        assert!(status.get_details_retry_info().is_none(), "no retry delay for a bad request");
        let error_info = status.get_details_error_info().expect("ErrorInfo");
        assert_eq!(error_info.metadata.get("field").map(String::as_str), Some("fire_at_ms"));
        assert_eq!(info_of(&status), info);
    }

    #[test]
    fn a_bare_error_info_from_an_older_node_is_still_read() {
        let status = tonic::Status::with_details(
            tonic::Code::Unavailable,
            "not the leader of shard 3",
            sample().encode_to_vec().into(),
        );
        assert_eq!(info_of(&status), sample());
    }

    #[test]
    fn a_status_without_details_still_has_an_info() {
        let status = tonic::Status::unavailable("gone");
        let info = info_of(&status);
        assert_eq!((info.code.as_str(), info.message.as_str()), ("UNAVAILABLE", "gone"));
    }
}
