"""Decoding of the standard google.rpc error details, without a node: the
statuses are built here the way the node's tocsin_contract::codes builds them
and carried in a grpc-status-details-bin trailer, as grpcio hands them over."""

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

import tocsin
from tocsin.errors import from_rpc_error
from tocsin.v1 import timer_pb2


class FailedCall(grpc.RpcError, grpc.Call):
    """The shape of a failed grpcio call: code, details and trailers."""

    def __init__(self, code, message, status=None):
        self._code, self._message = code, message
        self._trailers = (("grpc-status-details-bin", status.SerializeToString()),) if status else ()

    def code(self):
        return self._code

    def details(self):
        return self._message

    def trailing_metadata(self):
        return self._trailers

    def initial_metadata(self):
        return ()

    def is_active(self):
        return False

    def time_remaining(self):
        return None

    def cancel(self):
        return False

    def add_callback(self, callback):
        return False


def packed(msg, type_url=None):
    a = any_pb2.Any()
    a.Pack(msg)
    if type_url:
        a.type_url = type_url
    return a


def rich(code, grpc_code, message, *, reason=None, metadata=None, field=None, retry_ms=None):
    details = [
        packed(error_details_pb2.ErrorInfo(reason=reason or grpc_code.name, domain="tocsin", metadata=metadata or {}))
    ]
    if field:
        details.append(
            packed(
                error_details_pb2.BadRequest(
                    field_violations=[error_details_pb2.BadRequest.FieldViolation(field=field, description="bad")]
                )
            )
        )
    if retry_ms:
        details.append(
            packed(
                error_details_pb2.RetryInfo(
                    retry_delay=duration_pb2.Duration(seconds=retry_ms // 1000, nanos=(retry_ms % 1000) * 1_000_000)
                )
            )
        )
    details.append(packed(timer_pb2.ErrorInfo(code=grpc_code.name, message=message)))
    return FailedCall(grpc_code, message, status_pb2.Status(code=code, message=message, details=details))


def test_invalid_argument_names_its_field():
    err = from_rpc_error(
        rich(
            code_pb2.INVALID_ARGUMENT,
            grpc.StatusCode.INVALID_ARGUMENT,
            "namespace: must match [a-z0-9._-], found ' '",
            metadata={"code": "INVALID_ARGUMENT", "field": "namespace"},
            field="namespace",
        )
    )
    assert isinstance(err, tocsin.InvalidArgument)
    assert (err.code, err.field, err.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "namespace", "INVALID_ARGUMENT")
    assert err.retry_after is None and err.leader is None
    assert err.metadata["code"] == "INVALID_ARGUMENT"


def test_unavailable_carries_leader_and_retry_after():
    err = from_rpc_error(
        rich(
            code_pb2.UNAVAILABLE,
            grpc.StatusCode.UNAVAILABLE,
            "not the leader of shard 3",
            metadata={
                "code": "UNAVAILABLE",
                "leader_shard": "3",
                "leader_node_id": "2",
                "leader_grpc_addr": "10.0.0.2:7070",
                "leader_http_addr": "10.0.0.2:7071",
                "map_epoch": "12",
                "retry_after_ms": "1500",
            },
            retry_ms=1500,
        )
    )
    assert isinstance(err, tocsin.Unavailable)
    assert err.retry_after == pytest.approx(1.5)
    assert err.leader == {"node_id": 2, "grpc_addr": "10.0.0.2:7070", "http_addr": "10.0.0.2:7071", "shard": 3}
    assert err.map_epoch == 12


def test_finer_reason():
    err = from_rpc_error(
        rich(
            code_pb2.FAILED_PRECONDITION,
            grpc.StatusCode.FAILED_PRECONDITION,
            "timer is DELIVERED",
            reason="TIMER_FINISHED",
        )
    )
    assert isinstance(err, tocsin.FailedPrecondition)
    assert err.reason == "TIMER_FINISHED"


def test_status_without_details():
    err = from_rpc_error(FailedCall(grpc.StatusCode.NOT_FOUND, "no such timer"))
    assert isinstance(err, tocsin.NotFound)
    assert (err.field, err.retry_after, err.leader, err.reason, err.metadata) == (None, None, None, None, {})
    assert str(err) == "NOT_FOUND: no such timer"


def test_unknown_code_is_the_base_class():
    err = from_rpc_error(FailedCall(grpc.StatusCode.DATA_LOSS, "lost"))
    assert type(err) is tocsin.TocsinError


def test_every_subclass_is_a_tocsin_error():
    for cls in (
        tocsin.InvalidArgument,
        tocsin.NotFound,
        tocsin.AlreadyExists,
        tocsin.FailedPrecondition,
        tocsin.ResourceExhausted,
        tocsin.Unavailable,
        tocsin.Unauthenticated,
        tocsin.PermissionDenied,
    ):
        assert issubclass(cls, tocsin.TocsinError)
        assert type(from_rpc_error(FailedCall(cls.grpc_code, "x"))) is cls


def test_create_argument_checks():
    with pytest.raises(ValueError):
        tocsin.build_create_request("ns", "a", webhook="http://x")
    with pytest.raises(ValueError):
        tocsin.build_create_request("ns", "a", fire_at_ms=1, delay_ms=1, webhook="http://x")
    with pytest.raises(ValueError):
        tocsin.build_create_request("ns", "a", delay_ms=1, webhook="http://x", topic="t")
    with pytest.raises(ValueError):
        tocsin.build_create_request("ns", "a", delay_ms=1)
    req = tocsin.build_create_request("ns", "a", delay_ms=0, topic="jobs", labels={"k": "v"}, retry={"max_attempts": 3})
    assert req.WhichOneof("fire_time") == "delay_ms" and req.delay_ms == 0
    assert req.callback.pull.topic == "jobs" and req.retry.max_attempts == 3 and dict(req.labels) == {"k": "v"}
