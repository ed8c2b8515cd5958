"""A real node's errors, read through the standard google.rpc details."""

import time

import grpc
import pytest
from google.rpc import error_details_pb2
from _util import now_ms

import tocsin

HOOK = "http://127.0.0.1:9/never"


def unpack(err, message_type):
    """The one detail of ``message_type`` in the error's google.rpc.Status."""
    found = []
    for detail in err.status.details:
        if detail.Is(message_type.DESCRIPTOR):
            msg = message_type()
            detail.Unpack(msg)
            found.append(msg)
    assert len(found) == 1, f"{len(found)} {message_type.DESCRIPTOR.full_name} in {err.status}"
    return found[0]


def test_bad_namespace_names_the_field(client):
    with pytest.raises(tocsin.InvalidArgument) as exc:
        client.create("Bad Namespace!", "x", delay_ms=60_000, webhook=HOOK)
    err = exc.value
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.field == "namespace"
    # These come from the standard details: a google.rpc.Status with a
    # google.rpc.ErrorInfo (domain tocsin) and a google.rpc.BadRequest.
    assert err.status is not None, "the node sent no google.rpc.Status details"
    assert err.status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    info = unpack(err, error_details_pb2.ErrorInfo)
    assert (info.domain, info.reason, info.metadata["field"]) == ("tocsin", "INVALID_ARGUMENT", "namespace")
    bad = unpack(err, error_details_pb2.BadRequest)
    assert [v.field for v in bad.field_violations] == ["namespace"]
    assert bad.field_violations[0].description
    assert err.reason == "INVALID_ARGUMENT"
    assert err.metadata.get("code") == "INVALID_ARGUMENT"
    assert err.metadata.get("field") == "namespace"
    assert err.retry_after is None and err.leader is None
    assert err.message


def test_fire_time_in_the_past_names_fire_at_ms(client, namespace):
    with pytest.raises(tocsin.InvalidArgument) as exc:
        client.create(namespace, "late", fire_at_ms=now_ms() - 600_000, webhook=HOOK)
    assert exc.value.field == "fire_at_ms"
    assert "past" in exc.value.message


def test_get_of_a_missing_timer_is_not_found(client, namespace):
    with pytest.raises(tocsin.NotFound) as exc:
        client.get(namespace, "nobody")
    assert exc.value.code == grpc.StatusCode.NOT_FOUND
    assert exc.value.field is None and exc.value.retry_after is None
    assert exc.value.reason == "NOT_FOUND"
    assert unpack(exc.value, error_details_pb2.ErrorInfo).domain == "tocsin"


def test_over_quota_is_resource_exhausted_with_retry_after(node, client, namespace):
    # max-pending 1 cluster-wide is a share of 1 per shard: the second
    # pending timer on any shard is refused. The quota reaches the node
    # through the cluster map within about a second.
    node.cli("admin", "namespace", "set-quota", namespace, "--max-pending", "1")
    deadline = time.monotonic() + 20
    i = 0
    while True:
        try:
            client.create(namespace, f"q-{i}", delay_ms=600_000, topic="jobs")
        except tocsin.ResourceExhausted as err:
            exhausted = err
            break
        i += 1
        assert time.monotonic() < deadline, f"no RESOURCE_EXHAUSTED after {i} creates"
        time.sleep(0.05)
    assert exhausted.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert isinstance(exhausted.retry_after, float)
    assert exhausted.retry_after > 0
    # retry_after is the standard google.rpc.RetryInfo's delay.
    retry = unpack(exhausted, error_details_pb2.RetryInfo)
    assert retry.retry_delay.ToMilliseconds() == round(exhausted.retry_after * 1000)
    assert exhausted.metadata.get("retry_after_ms") == str(round(exhausted.retry_after * 1000))
    assert exhausted.reason == "RESOURCE_EXHAUSTED"
    assert "quota" in exhausted.message
