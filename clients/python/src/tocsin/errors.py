"""Tocsin's errors: every failed call raises a :class:`TocsinError`.

A node answers a failed call with a gRPC status whose details are a standard
``google.rpc.Status`` (the ``grpc-status-details-bin`` trailer). Its details
hold a ``google.rpc.ErrorInfo`` (domain ``"tocsin"``; ``reason`` the code
name or a finer reason such as ``TIMER_FINISHED``; metadata ``code``,
``field``, ``leader_shard``, ``leader_node_id``, ``leader_grpc_addr``,
``leader_http_addr``, ``map_epoch``, ``retry_after_ms``, each when it
applies), a ``google.rpc.BadRequest`` naming the field at fault, and a
``google.rpc.RetryInfo`` when a retry makes sense after a delay. This module
reads those standard messages with ``grpcio-status`` and
``googleapis-common-protos``; a status without details still becomes a
:class:`TocsinError`, with ``field``, ``reason``, ``retry_after`` and
``leader`` set to ``None``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Type

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

__all__ = [
    "ERROR_DOMAIN",
    "TocsinError",
    "InvalidArgument",
    "NotFound",
    "AlreadyExists",
    "FailedPrecondition",
    "ResourceExhausted",
    "Unavailable",
    "Unauthenticated",
    "PermissionDenied",
    "DeadlineExceeded",
    "Cancelled",
    "Internal",
    "from_rpc_error",
]

#: ``google.rpc.ErrorInfo.domain`` of every error a Tocsin node answers.
ERROR_DOMAIN = "tocsin"


class TocsinError(Exception):
    """A failed call to a Tocsin node.

    Attributes:
        code: the gRPC status code (``grpc.StatusCode``).
        message: the status message (lowercase, no trailing period).
        field: the request field at fault (``INVALID_ARGUMENT``), such as
            ``"namespace"`` or ``"fire_at_ms"``; ``None`` when none is named.
        reason: ``google.rpc.ErrorInfo.reason``: the code's name, or a finer
            reason such as ``"TIMER_FINISHED"``; ``None`` without details.
        retry_after: seconds to wait before retrying (from
            ``google.rpc.RetryInfo``), or ``None`` when no delay was given.
        leader: where to retry when this node is not the shard's leader:
            a dict with ``node_id`` (int or None), ``grpc_addr``,
            ``http_addr`` (str or None) and ``shard`` (int or None);
            ``None`` when the node named no leader.
        map_epoch: the shard map epoch the node holds, when it said.
        metadata: ``google.rpc.ErrorInfo.metadata`` as a plain dict (empty
            without details).
        status: the decoded ``google.rpc.Status``, or ``None``.
    """

    #: The code a subclass stands for (None on the base class).
    grpc_code: Optional[grpc.StatusCode] = None

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        field: Optional[str] = None,
        reason: Optional[str] = None,
        retry_after: Optional[float] = None,
        leader: Optional[Dict[str, Any]] = None,
        map_epoch: Optional[int] = None,
        metadata: Optional[Dict[str, str]] = None,
        status: Optional[status_pb2.Status] = None,
    ) -> None:
        self.code = code
        self.message = message
        self.field = field
        self.reason = reason
        self.retry_after = retry_after
        self.leader = leader
        self.map_epoch = map_epoch
        self.metadata: Dict[str, str] = dict(metadata or {})
        self.status = status
        super().__init__(str(self))

    def __str__(self) -> str:
        name = self.code.name if isinstance(self.code, grpc.StatusCode) else str(self.code)
        text = f"{name}: {self.message}"
        if self.field and not self.message.startswith(self.field):
            text += f" (field {self.field})"
        if self.retry_after is not None:
            text += f" (retry after {self.retry_after:g} s)"
        return text

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code}, message={self.message!r}, field={self.field!r}, "
            f"reason={self.reason!r}, retry_after={self.retry_after!r}, leader={self.leader!r})"
        )

    def __reduce__(self):  # keep the attributes across pickling
        return (_rebuild, (type(self), self.code, self.message, self.__dict__))


def _rebuild(cls: Type["TocsinError"], code: grpc.StatusCode, message: str, state: Dict[str, Any]) -> "TocsinError":
    err = cls.__new__(cls)
    Exception.__init__(err, f"{code}: {message}")
    err.__dict__.update(state)
    return err


class InvalidArgument(TocsinError):
    """A request field is malformed; ``field`` names it."""

    grpc_code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(TocsinError):
    """No such timer."""

    grpc_code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(TocsinError):
    """The id is taken by a timer with a different spec."""

    grpc_code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(TocsinError):
    """A reschedule's expected generation or a timer's state does not match
    (``reason == "TIMER_FINISHED"``: the id holds a finished timer)."""

    grpc_code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(TocsinError):
    """Over a limit (rate, quota, size, disk); retry after ``retry_after``."""

    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(TocsinError):
    """No leader right now, or this node is not the leader (see ``leader``)."""

    grpc_code = grpc.StatusCode.UNAVAILABLE


class Unauthenticated(TocsinError):
    """No bearer token, or one the cluster does not know."""

    grpc_code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(TocsinError):
    """The token's grants do not cover the call."""

    grpc_code = grpc.StatusCode.PERMISSION_DENIED


class DeadlineExceeded(TocsinError):
    """The call's deadline (the client's ``timeout``) passed."""

    grpc_code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(TocsinError):
    """The call was cancelled."""

    grpc_code = grpc.StatusCode.CANCELLED


class Internal(TocsinError):
    """The node failed in a way that is not the request's fault."""

    grpc_code = grpc.StatusCode.INTERNAL


_BY_CODE: Dict[grpc.StatusCode, Type[TocsinError]] = {
    cls.grpc_code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        FailedPrecondition,
        ResourceExhausted,
        Unavailable,
        Unauthenticated,
        PermissionDenied,
        DeadlineExceeded,
        Cancelled,
        Internal,
    )
    if cls.grpc_code is not None
}

_CODE_BY_NAME: Dict[str, grpc.StatusCode] = {c.name: c for c in grpc.StatusCode}


def error_class(code: grpc.StatusCode) -> Type[TocsinError]:
    """The :class:`TocsinError` subclass raised for ``code``."""
    return _BY_CODE.get(code, TocsinError)


def _int_or_none(value: Optional[str]) -> Optional[int]:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _leader_of(metadata: Dict[str, str]) -> Optional[Dict[str, Any]]:
    keys = ("leader_shard", "leader_node_id", "leader_grpc_addr", "leader_http_addr")
    if not any(k in metadata for k in keys):
        return None
    return {
        "node_id": _int_or_none(metadata.get("leader_node_id")),
        "grpc_addr": metadata.get("leader_grpc_addr") or None,
        "http_addr": metadata.get("leader_http_addr") or None,
        "shard": _int_or_none(metadata.get("leader_shard")),
    }


def _status_of(err: grpc.RpcError) -> Optional[status_pb2.Status]:
    """The ``google.rpc.Status`` in the call's trailers, if it has one."""
    if not hasattr(err, "trailing_metadata") or not hasattr(err, "code"):
        return None
    try:
        return rpc_status.from_call(err)  # type: ignore[arg-type]
    except ValueError:
        # The details' code or message disagree with the status itself:
        # not details this client can trust.
        return None


def from_status(
    code: grpc.StatusCode, message: str, status: Optional[status_pb2.Status]
) -> TocsinError:
    """The :class:`TocsinError` for a status ``code``/``message`` whose
    details are ``status`` (a ``google.rpc.Status``, or ``None``)."""
    field: Optional[str] = None
    reason: Optional[str] = None
    retry_after: Optional[float] = None
    metadata: Dict[str, str] = {}
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                if info.domain == ERROR_DOMAIN or reason is None:
                    reason = info.reason or None
                    metadata = dict(info.metadata)
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                if bad.field_violations and field is None:
                    field = bad.field_violations[0].field or None
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                if retry.HasField("retry_delay"):
                    d = retry.retry_delay
                    retry_after = d.seconds + d.nanos / 1e9
    if field is None and metadata.get("field"):
        field = metadata["field"]
    if retry_after is None and metadata.get("retry_after_ms"):
        ms = _int_or_none(metadata["retry_after_ms"])
        retry_after = ms / 1000.0 if ms is not None else None
    return error_class(code)(
        code,
        message,
        field=field,
        reason=reason,
        retry_after=retry_after,
        leader=_leader_of(metadata),
        map_epoch=_int_or_none(metadata.get("map_epoch")),
        metadata=metadata,
        status=status,
    )


def from_rpc_error(err: grpc.RpcError) -> TocsinError:
    """Turns a ``grpc.RpcError`` from a Tocsin node into a
    :class:`TocsinError` (of the subclass for its code), reading the standard
    ``google.rpc`` details the node attaches."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    if not isinstance(code, grpc.StatusCode):
        code = grpc.StatusCode.UNKNOWN
    message = (err.details() if hasattr(err, "details") else None) or ""
    return from_status(code, message, _status_of(err))


def from_error_info(info: Any) -> TocsinError:
    """The :class:`TocsinError` for a ``tocsin.v1.ErrorInfo`` message, as a
    batch answers (``CreateTimerResult.error``, ``RedriveResult.error``) per
    item rather than as a status."""
    code = _CODE_BY_NAME.get(info.code, grpc.StatusCode.UNKNOWN)
    leader = None
    if info.HasField("leader"):
        leader = {
            "node_id": info.leader.node_id or None,
            "grpc_addr": info.leader.grpc_addr or None,
            "http_addr": info.leader.http_addr or None,
            "shard": info.leader.shard,
        }
    return error_class(code)(
        code,
        info.message,
        field=info.field or None,
        reason=info.reason or info.code or None,
        retry_after=info.retry_after_ms / 1000.0 if info.retry_after_ms else None,
        leader=leader,
        map_epoch=info.map_epoch or None,
    )
