"""A thin, synchronous client for one Tocsin node's gRPC API."""

from __future__ import annotations

import queue
import threading
from typing import (
    Any,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import grpc

from tocsin.errors import TocsinError, from_error_info, from_rpc_error
from tocsin.v1 import admin_pb2_grpc, timer_pb2, timer_pb2_grpc

__all__ = ["Client", "Delivery", "Reservation", "DEFAULT_MAX_RECEIVE_MESSAGE_BYTES"]

#: The receive limit every gRPC library defaults to. A node keeps each
#: Reserve message under it (a bigger batch comes as several messages).
DEFAULT_MAX_RECEIVE_MESSAGE_BYTES = 4 * 1024 * 1024

Timer = timer_pb2.Timer
RetryLike = Union[timer_pb2.RetryPolicy, Mapping[str, int], None]
RecurrenceLike = Union[timer_pb2.Recurrence, Mapping[str, Any], None]
StateLike = Union[str, int, None]


def _state_value(state: StateLike) -> Any:
    if state is None:
        return timer_pb2.Timer.STATE_UNSPECIFIED
    if isinstance(state, str):
        return timer_pb2.Timer.State.Value(state.upper())
    return int(state)


def _retry_policy(retry: RetryLike) -> Optional[timer_pb2.RetryPolicy]:
    if retry is None:
        return None
    if isinstance(retry, timer_pb2.RetryPolicy):
        return retry
    return timer_pb2.RetryPolicy(**dict(retry))


def _recurrence(recurrence: RecurrenceLike) -> Optional[timer_pb2.Recurrence]:
    if recurrence is None:
        return None
    if isinstance(recurrence, timer_pb2.Recurrence):
        return recurrence
    return timer_pb2.Recurrence(**dict(recurrence))


def build_create_request(
    namespace: str,
    id: str,
    *,
    fire_at_ms: Optional[int] = None,
    delay_ms: Optional[int] = None,
    payload: Union[bytes, str] = b"",
    webhook: Optional[str] = None,
    topic: Optional[str] = None,
    ttr_ms: int = 0,
    labels: Optional[Mapping[str, str]] = None,
    retry: RetryLike = None,
    replace_finished: bool = False,
    skip_if_late_ms: int = 0,
    recurrence: RecurrenceLike = None,
) -> timer_pb2.CreateTimerRequest:
    """The ``CreateTimerRequest`` :meth:`Client.create` sends (see there)."""
    if fire_at_ms is not None and delay_ms is not None:
        raise ValueError("give fire_at_ms or delay_ms, not both")
    if fire_at_ms is None and delay_ms is None and recurrence is None:
        raise ValueError("give fire_at_ms or delay_ms")
    if (webhook is None) == (topic is None):
        raise ValueError("give exactly one of webhook (a URL) or topic (a pull topic)")
    if webhook is not None and ttr_ms:
        raise ValueError("ttr_ms applies to pull timers (topic=) only")
    if isinstance(payload, str):
        payload = payload.encode("utf-8")
    callback = (
        timer_pb2.Callback(webhook=timer_pb2.Webhook(url=webhook))
        if webhook is not None
        else timer_pb2.Callback(pull=timer_pb2.Pull(topic=topic or "", ttr_ms=ttr_ms))
    )
    req = timer_pb2.CreateTimerRequest(
        namespace=namespace,
        id=id,
        payload=payload,
        labels=dict(labels or {}),
        callback=callback,
        replace_finished=replace_finished,
        skip_if_late_ms=skip_if_late_ms,
    )
    # Setting a oneof member marks it even when it is 0 (delay_ms=0: now).
    if fire_at_ms is not None:
        req.fire_at_ms = fire_at_ms
    elif delay_ms is not None:
        req.delay_ms = delay_ms
    policy = _retry_policy(retry)
    if policy is not None:
        req.retry.CopyFrom(policy)
    rec = _recurrence(recurrence)
    if rec is not None:
        req.recurrence.CopyFrom(rec)
    return req


DeliveryLike = Union["Delivery", timer_pb2.Delivery, timer_pb2.DeliveryRef]


def _ref(d: DeliveryLike) -> timer_pb2.DeliveryRef:
    if isinstance(d, timer_pb2.DeliveryRef):
        return d
    if isinstance(d, Delivery):
        d = d.proto
    return timer_pb2.DeliveryRef(namespace=d.namespace, id=d.id, fire_id=d.fire_id, attempt=d.attempt)


def _ack_status(result: timer_pb2.AckResult) -> str:
    return timer_pb2.AckResult.Status.Name(result.status)


class Client:
    """A connection to a Tocsin node's gRPC API (``TimerService``; the raw
    ``AdminService`` stub is :attr:`admin_stub`).

    Every failed call raises :class:`tocsin.TocsinError` (a subclass per
    code). The client is thread-safe; use one per process and close it
    (or use it as a context manager)::

        with Client("127.0.0.1:7070") as tocsin:
            timer, created = tocsin.create("orders", "order-42", delay_ms=60_000,
                                           webhook="https://example.com/hook")

    Args:
        target: the node's gRPC address, ``host:port``.
        token: a bearer token, sent as ``authorization: Bearer <token>``
            metadata on every call (not needed by a ``tocsin dev`` node).
        timeout: each unary call's deadline, in seconds (None: no deadline).
            ``reserve`` streams have none.
        credentials: ``grpc.ssl_channel_credentials(...)`` for TLS; the
            channel is plaintext without it.
        options: extra gRPC channel options.
    """

    def __init__(
        self,
        target: str = "127.0.0.1:7070",
        token: Optional[str] = None,
        timeout: Optional[float] = 10.0,
        *,
        credentials: Optional[grpc.ChannelCredentials] = None,
        options: Optional[Sequence[Tuple[str, Any]]] = None,
    ) -> None:
        self.target = target
        self.timeout = timeout
        opts: List[Tuple[str, Any]] = [
            ("grpc.max_receive_message_length", DEFAULT_MAX_RECEIVE_MESSAGE_BYTES),
        ]
        opts.extend(options or ())
        if credentials is None:
            self._channel = grpc.insecure_channel(target, options=opts)
        else:
            self._channel = grpc.secure_channel(target, credentials, options=opts)
        #: Metadata sent with every call (the bearer token, if any).
        self.metadata: Tuple[Tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        #: The generated ``TimerService`` stub, for calls this layer does not wrap.
        self.timer_stub = timer_pb2_grpc.TimerServiceStub(self._channel)
        #: The generated ``AdminService`` stub (pass ``metadata=client.metadata``).
        self.admin_stub = admin_pb2_grpc.AdminServiceStub(self._channel)

    # -- lifecycle -------------------------------------------------------

    @property
    def channel(self) -> grpc.Channel:
        """The underlying gRPC channel."""
        return self._channel

    def close(self) -> None:
        """Closes the channel (and with it any open reserve stream)."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _call(self, method: Any, request: Any, timeout: Optional[float] = None) -> Any:
        try:
            return method(request, timeout=self.timeout if timeout is None else timeout, metadata=self.metadata)
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    # -- timers ----------------------------------------------------------

    def create(
        self,
        namespace: str,
        id: str,
        *,
        fire_at_ms: Optional[int] = None,
        delay_ms: Optional[int] = None,
        payload: Union[bytes, str] = b"",
        webhook: Optional[str] = None,
        topic: Optional[str] = None,
        ttr_ms: int = 0,
        labels: Optional[Mapping[str, str]] = None,
        retry: RetryLike = None,
        replace_finished: bool = False,
        skip_if_late_ms: int = 0,
        recurrence: RecurrenceLike = None,
        timeout: Optional[float] = None,
    ) -> Tuple[timer_pb2.Timer, bool]:
        """Creates a timer; returns ``(timer, created)``.

        Idempotent: the id is the idempotency key, and retrying with the same
        spec answers the existing timer with ``created`` False.

        Args:
            namespace: ``[a-z0-9._-]``, 1-64 bytes.
            id: the timer's id within the namespace (1-256 bytes).
            fire_at_ms: absolute fire time, unix ms. Exactly one of this and
                ``delay_ms`` (either may be left out for a recurring timer).
            delay_ms: fire this long from now (as the shard leader stamps it).
            payload: delivered as is (str is UTF-8 encoded).
            webhook: a URL to POST the delivery to. Exactly one of this and
                ``topic``.
            topic: a pull topic: consumers get the timer from :meth:`reserve`.
            ttr_ms: a pull timer's own time-to-run (0: the consumer's).
            labels: string labels, delivered with the timer.
            retry: a ``RetryPolicy`` or a dict of its fields (max_attempts,
                initial_backoff_ms, max_backoff_ms, give_up_after_ms).
            replace_finished: replace a finished timer under the same id
                (otherwise refused: FailedPrecondition, reason TIMER_FINISHED).
            skip_if_late_ms: the late-fire policy (0: fire however late).
            recurrence: a ``Recurrence`` or a dict (cron/every_ms, time_zone,
                until_ms, count, catch_up_all).
            timeout: this call's deadline in seconds (default: the client's).

        Raises:
            ValueError: the arguments do not describe one timer.
            TocsinError: the node refused (InvalidArgument with ``field``,
                AlreadyExists, FailedPrecondition, ResourceExhausted, ...).
        """
        req = build_create_request(
            namespace,
            id,
            fire_at_ms=fire_at_ms,
            delay_ms=delay_ms,
            payload=payload,
            webhook=webhook,
            topic=topic,
            ttr_ms=ttr_ms,
            labels=labels,
            retry=retry,
            replace_finished=replace_finished,
            skip_if_late_ms=skip_if_late_ms,
            recurrence=recurrence,
        )
        resp = self._call(self.timer_stub.CreateTimer, req, timeout)
        return resp.timer, resp.created

    def create_many(
        self,
        timers: Iterable[Union[Mapping[str, Any], timer_pb2.CreateTimerRequest]],
        *,
        timeout: Optional[float] = None,
    ) -> List[Union[Tuple[timer_pb2.Timer, bool], TocsinError]]:
        """Creates up to 1,000 timers in one call. Each item is a
        ``CreateTimerRequest`` or a dict of :meth:`create`'s arguments
        (``namespace`` and ``id`` included). Returns, in order, one
        ``(timer, created)`` per success and one :class:`TocsinError` (not
        raised) per refused item; a failure of the whole call is raised."""
        reqs = [
            t if isinstance(t, timer_pb2.CreateTimerRequest) else build_create_request(**dict(t))  # type: ignore[arg-type]
            for t in timers
        ]
        resp = self._call(self.timer_stub.CreateTimers, timer_pb2.CreateTimersRequest(timers=reqs), timeout)
        out: List[Union[Tuple[timer_pb2.Timer, bool], TocsinError]] = []
        for result in resp.results:
            if result.WhichOneof("result") == "ok":
                out.append((result.ok.timer, result.ok.created))
            else:
                out.append(from_error_info(result.error))
        return out

    def get(
        self, namespace: str, id: str, *, include_attempts: bool = False, timeout: Optional[float] = None
    ) -> timer_pb2.Timer:
        """The timer ``(namespace, id)``; ``include_attempts`` fills its
        attempt history. Raises :class:`tocsin.NotFound` if there is none."""
        req = timer_pb2.GetTimerRequest(namespace=namespace, id=id, include_attempts=include_attempts)
        return self._call(self.timer_stub.GetTimer, req, timeout).timer

    def list(
        self,
        namespace: str,
        *,
        state: StateLike = None,
        fire_after_ms: int = 0,
        fire_before_ms: int = 0,
        page_size: int = 100,
        dead_reason: str = "",
        timeout: Optional[float] = None,
    ) -> Iterator[timer_pb2.Timer]:
        """Iterates over a namespace's timers, fetching page after page.

        Args:
            state: a state name ("SCHEDULED", "DEAD", ...) or value; None
                for every state.
            fire_after_ms, fire_before_ms: the half-open fire-time range
                ``[after, before)``; 0 leaves a side unbounded.
            page_size: timers per page (at most 1,000).
            dead_reason: only DEAD timers that gave up for this reason
                (MAX_ATTEMPTS, GIVE_UP_AFTER, GONE).
            timeout: each page's deadline.
        """
        req = timer_pb2.ListTimersRequest(
            namespace=namespace,
            state=_state_value(state),
            fire_after_ms=fire_after_ms,
            fire_before_ms=fire_before_ms,
            page_size=page_size,
            dead_reason=dead_reason,
        )
        while True:
            resp = self._call(self.timer_stub.ListTimers, req, timeout)
            yield from resp.timers
            # A short (even empty) page may still have a next one: only an
            # empty token ends the listing.
            if not resp.next_page_token:
                return
            req.page_token = resp.next_page_token

    def cancel(self, namespace: str, id: str, *, timeout: Optional[float] = None) -> str:
        """Cancels a timer; returns the outcome's name: ``"CANCELLED"``,
        ``"ALREADY_CANCELLED"``, ``"ALREADY_FIRED"``, ``"NOT_FOUND"`` or
        ``"CANCELLED_WHILE_FIRING"``. Use :meth:`cancel_response` for the
        timer, its fire and ``attempt_in_flight``."""
        return timer_pb2.CancelTimerResponse.Outcome.Name(self.cancel_response(namespace, id, timeout=timeout).outcome)

    def cancel_response(
        self, namespace: str, id: str, *, timeout: Optional[float] = None
    ) -> timer_pb2.CancelTimerResponse:
        """Cancels a timer; returns the whole ``CancelTimerResponse``."""
        req = timer_pb2.CancelTimerRequest(namespace=namespace, id=id)
        return self._call(self.timer_stub.CancelTimer, req, timeout)

    def reschedule(
        self,
        namespace: str,
        id: str,
        *,
        fire_at_ms: Optional[int] = None,
        delay_ms: Optional[int] = None,
        expected_generation: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> timer_pb2.Timer:
        """Moves a scheduled timer's fire time (exactly one of ``fire_at_ms``
        and ``delay_ms``); returns the timer, its generation raised.

        ``expected_generation`` makes it a compare-and-set: a timer changed
        since raises :class:`tocsin.FailedPrecondition`. Without it the
        current generation is read first (no protection against a
        concurrent change)."""
        if (fire_at_ms is None) == (delay_ms is None):
            raise ValueError("give exactly one of fire_at_ms or delay_ms")
        if expected_generation is None:
            expected_generation = self.get(namespace, id, timeout=timeout).generation
        req = timer_pb2.RescheduleTimerRequest(namespace=namespace, id=id, expected_generation=expected_generation)
        if fire_at_ms is not None:
            req.fire_at_ms = fire_at_ms
        else:
            req.delay_ms = delay_ms  # type: ignore[assignment]
        return self._call(self.timer_stub.RescheduleTimer, req, timeout).timer

    def redrive(
        self, namespace: str, ids: Sequence[str], *, timeout: Optional[float] = None
    ) -> List[timer_pb2.RedriveResult]:
        """Starts DEAD timers over (up to 1,000 ids); one result per id."""
        req = timer_pb2.RedriveTimersRequest(namespace=namespace, ids=list(ids))
        return list(self._call(self.timer_stub.RedriveTimers, req, timeout).results)

    def horizon(self, namespace: str, *, timeout: Optional[float] = None) -> timer_pb2.GetHorizonResponse:
        """How many scheduled timers of a namespace fire in the next minute,
        hour and day."""
        return self._call(self.timer_stub.GetHorizon, timer_pb2.GetHorizonRequest(namespace=namespace), timeout)

    # -- pull ------------------------------------------------------------

    def reserve(
        self,
        namespace: str,
        topic: str,
        *,
        ttr_ms: int = 0,
        max_batch: int = 0,
        max_in_flight: int = 0,
    ) -> "Reservation":
        """Opens a pull stream on ``namespace``/``topic``: a
        :class:`Reservation`, iterating :class:`Delivery` objects as timers
        fire. Each must be acked (``d.ack()``) or nacked (``d.nack(...)``)
        within its time-to-run (``ttr_ms``; 0 = 30 s), or it is delivered
        again (attempt + 1). Close the reservation (or leave its ``with``
        block) to cancel the stream::

            with client.reserve("orders", "close-order", ttr_ms=60_000) as r:
                for d in r:
                    handle(d.payload)
                    d.ack()

        Args:
            ttr_ms: time to run, ms (0 = 30 s).
            max_batch: most deliveries per stream message (0 = 256).
            max_in_flight: most reserved and unacked at once (0 = 10,000).
        """
        req = timer_pb2.ReserveRequest(
            namespace=namespace, topic=topic, ttr_ms=ttr_ms, max_batch=max_batch, max_in_flight=max_in_flight
        )
        try:
            call = self.timer_stub.Reserve(req, metadata=self.metadata)
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        return Reservation(self, call)

    def ack(self, deliveries: Iterable[DeliveryLike], *, timeout: Optional[float] = None) -> List[str]:
        """Marks deliveries done; one status name per delivery, in order:
        ``"OK"``, ``"STALE"`` (the reservation expired; it is delivered
        again) or ``"NOT_FOUND"``."""
        refs = [_ref(d) for d in deliveries]
        if not refs:
            return []
        resp = self._call(self.timer_stub.Ack, timer_pb2.AckRequest(deliveries=refs), timeout)
        return [_ack_status(r) for r in resp.results]

    def nack(
        self,
        deliveries: Iterable[DeliveryLike],
        *,
        delay_ms: int = 0,
        reason: str = "",
        timeout: Optional[float] = None,
    ) -> List[str]:
        """Hands deliveries back for a retry after ``delay_ms`` (0: the
        timer's backoff), counted as an attempt; statuses as :meth:`ack`."""
        refs = [_ref(d) for d in deliveries]
        if not refs:
            return []
        req = timer_pb2.NackRequest(deliveries=refs, delay_ms=delay_ms, reason=reason)
        resp = self._call(self.timer_stub.Nack, req, timeout)
        return [_ack_status(r) for r in resp.results]


class Delivery:
    """A fired pull timer, as a :class:`Reservation` yields it.

    Every ``tocsin.v1.Delivery`` field reads as an attribute: ``namespace``,
    ``id``, ``payload``, ``fire_at_ms``, ``fired_at_ms``, ``attempt``,
    ``shard``, ``epoch``, ``fire_id``, ``labels``, ``reserved_until_ms``,
    ``topic``, ``cluster_id``, ``late_by_ms``, ``occurrence``; the message
    itself is :attr:`proto`. Fence it like a webhook delivery
    (:class:`tocsin.webhook.Fence` takes it as is).
    """

    __slots__ = ("proto", "_client")

    def __init__(self, client: Client, proto: timer_pb2.Delivery) -> None:
        self.proto = proto
        self._client = client

    def __getattr__(self, name: str) -> Any:
        # Only called for names not found otherwise: the proto's fields.
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.proto, name)

    @property
    def ref(self) -> timer_pb2.DeliveryRef:
        """The ``DeliveryRef`` naming this delivery (namespace, id, fire id,
        attempt)."""
        return _ref(self.proto)

    def ack(self, *, timeout: Optional[float] = None) -> str:
        """Marks it done: ``"OK"``, or ``"STALE"`` if its reservation expired
        (it is then delivered again), or ``"NOT_FOUND"``."""
        return self._client.ack([self.proto], timeout=timeout)[0]

    def nack(self, *, delay_ms: int = 0, reason: str = "", timeout: Optional[float] = None) -> str:
        """Hands it back for a retry after ``delay_ms`` (0: the timer's
        backoff); counted as an attempt. Statuses as :meth:`ack`."""
        return self._client.nack([self.proto], delay_ms=delay_ms, reason=reason, timeout=timeout)[0]

    def __repr__(self) -> str:
        p = self.proto
        return (
            f"Delivery(namespace={p.namespace!r}, id={p.id!r}, fire_id={p.fire_id!r}, attempt={p.attempt}, "
            f"shard={p.shard}, epoch={p.epoch})"
        )


_END = object()


def _read_stream(client: Client, call: Any, out: "queue.Queue[Any]", closed: threading.Event) -> None:
    """Moves a Reserve stream's deliveries into ``out``, then its error (if
    it failed while open) and an end marker."""
    try:
        for resp in call:
            for d in resp.deliveries:
                out.put(Delivery(client, d))
    except grpc.RpcError as err:
        if not closed.is_set():
            out.put(from_rpc_error(err))
    except Exception as err:  # noqa: BLE001 - handed to the consumer
        if not closed.is_set():
            out.put(err)
    finally:
        out.put(_END)


class Reservation:
    """An open ``Reserve`` stream: iterate it for :class:`Delivery` objects
    (blocking until timers fire), or call :meth:`get` with a timeout. A
    context manager; :meth:`close` cancels the stream. A failure of the
    stream is raised as :class:`tocsin.TocsinError` from the iteration.
    """

    def __init__(self, client: Client, call: Any) -> None:
        self._client = client
        self._call = call
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._closed = threading.Event()
        self._done = False
        # The reader holds no reference to the reservation, so one dropped
        # without close() is still collected, and its stream cancelled.
        self._reader = threading.Thread(
            target=_read_stream,
            args=(client, call, self._queue, self._closed),
            name="tocsin-reserve",
            daemon=True,
        )
        self._reader.start()

    def get(self, timeout: Optional[float] = None) -> Optional[Delivery]:
        """The next delivery, waiting up to ``timeout`` seconds (None: as long
        as it takes); None if none came in time.

        Raises:
            StopIteration: the stream ended (closed, or the node ended it).
            TocsinError: the stream failed.
        """
        if self._done:
            raise StopIteration
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is _END:
            self._done = True
            raise StopIteration
        if isinstance(item, BaseException):
            self._done = True
            raise item
        return item

    def __iter__(self) -> "Reservation":
        return self

    def __next__(self) -> Delivery:
        item = self.get()
        assert item is not None
        return item

    def close(self) -> None:
        """Cancels the stream. Deliveries reserved and not acked go back to
        the topic when their time-to-run ends."""
        self._closed.set()
        self._call.cancel()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed.is_set()

    def __enter__(self) -> "Reservation":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._call.cancel()
        except Exception:  # noqa: BLE001
            pass
