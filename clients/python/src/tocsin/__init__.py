"""Python client for Tocsin, a Raft-replicated timer service.

::

    import tocsin

    with tocsin.Client("127.0.0.1:7070") as c:
        timer, created = c.create("orders", "order-42", delay_ms=60_000,
                                  webhook="https://example.com/hook", payload=b"{}")
        c.cancel("orders", "order-42")        # "CANCELLED"

- :class:`Client`: create, get, list, cancel, reschedule, reserve/ack/nack.
- :class:`TocsinError` and its subclasses: every failed call, with the
  ``field``, ``reason``, ``retry_after`` and ``leader`` the node's standard
  ``google.rpc`` error details carry.
- :mod:`tocsin.webhook`: :func:`~tocsin.webhook.verify_signature` and
  :class:`~tocsin.webhook.Fence` for webhook receivers.
- :mod:`tocsin.v1`: the generated protobuf/gRPC stubs.
"""

from tocsin.client import (
    DEFAULT_MAX_RECEIVE_MESSAGE_BYTES,
    Client,
    Delivery,
    Reservation,
    build_create_request,
)
from tocsin.errors import (
    AlreadyExists,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    TocsinError,
    Unauthenticated,
    Unavailable,
    from_rpc_error,
)
from tocsin.v1 import timer_pb2 as _timer_pb2
from tocsin.webhook import Fence, verify_signature

__version__ = "0.1.0"

#: ``tocsin.v1.Timer``, what :meth:`Client.get` and friends return.
Timer = _timer_pb2.Timer


def state_name(timer: "_timer_pb2.Timer") -> str:
    """A timer's state as its name: ``"SCHEDULED"``, ``"FIRING"``,
    ``"DELIVERED"``, ``"DEAD"``, ``"CANCELLED"`` or ``"SKIPPED"``."""
    return _timer_pb2.Timer.State.Name(timer.state)


__all__ = [
    "Client",
    "Delivery",
    "Reservation",
    "Timer",
    "state_name",
    "build_create_request",
    "DEFAULT_MAX_RECEIVE_MESSAGE_BYTES",
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
    "Fence",
    "verify_signature",
    "__version__",
]
