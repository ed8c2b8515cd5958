from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Timer(_message.Message):
    __slots__ = ("namespace", "id", "state", "fire_at_ms", "payload", "labels", "callback", "retry", "generation", "created_at_ms", "shard", "fire", "finished_at_ms", "retained_until_ms", "attempts", "skip_if_late_ms", "recurrence", "series")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[Timer.State]
        SCHEDULED: _ClassVar[Timer.State]
        FIRING: _ClassVar[Timer.State]
        DELIVERED: _ClassVar[Timer.State]
        DEAD: _ClassVar[Timer.State]
        CANCELLED: _ClassVar[Timer.State]
        SKIPPED: _ClassVar[Timer.State]
    STATE_UNSPECIFIED: Timer.State
    SCHEDULED: Timer.State
    FIRING: Timer.State
    DELIVERED: Timer.State
    DEAD: Timer.State
    CANCELLED: Timer.State
    SKIPPED: Timer.State
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FIRE_AT_MS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CALLBACK_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    FIRE_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    RETAINED_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    SKIP_IF_LATE_MS_FIELD_NUMBER: _ClassVar[int]
    RECURRENCE_FIELD_NUMBER: _ClassVar[int]
    SERIES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    id: str
    state: Timer.State
    fire_at_ms: int
    payload: bytes
    labels: _containers.ScalarMap[str, str]
    callback: Callback
    retry: RetryPolicy
    generation: int
    created_at_ms: int
    shard: int
    fire: FireInfo
    finished_at_ms: int
    retained_until_ms: int
    attempts: _containers.RepeatedCompositeFieldContainer[AttemptInfo]
    skip_if_late_ms: int
    recurrence: Recurrence
    series: SeriesInfo
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., state: _Optional[_Union[Timer.State, str]] = ..., fire_at_ms: _Optional[int] = ..., payload: _Optional[bytes] = ..., labels: _Optional[_Mapping[str, str]] = ..., callback: _Optional[_Union[Callback, _Mapping]] = ..., retry: _Optional[_Union[RetryPolicy, _Mapping]] = ..., generation: _Optional[int] = ..., created_at_ms: _Optional[int] = ..., shard: _Optional[int] = ..., fire: _Optional[_Union[FireInfo, _Mapping]] = ..., finished_at_ms: _Optional[int] = ..., retained_until_ms: _Optional[int] = ..., attempts: _Optional[_Iterable[_Union[AttemptInfo, _Mapping]]] = ..., skip_if_late_ms: _Optional[int] = ..., recurrence: _Optional[_Union[Recurrence, _Mapping]] = ..., series: _Optional[_Union[SeriesInfo, _Mapping]] = ...) -> None: ...

class Recurrence(_message.Message):
    __slots__ = ("cron", "every_ms", "time_zone", "until_ms", "count", "catch_up_all")
    CRON_FIELD_NUMBER: _ClassVar[int]
    EVERY_MS_FIELD_NUMBER: _ClassVar[int]
    TIME_ZONE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_ALL_FIELD_NUMBER: _ClassVar[int]
    cron: str
    every_ms: int
    time_zone: str
    until_ms: int
    count: int
    catch_up_all: bool
    def __init__(self, cron: _Optional[str] = ..., every_ms: _Optional[int] = ..., time_zone: _Optional[str] = ..., until_ms: _Optional[int] = ..., count: _Optional[int] = ..., catch_up_all: bool = ...) -> None: ...

class SeriesInfo(_message.Message):
    __slots__ = ("occurrence", "next_fire_at_ms", "delivered", "dead", "skipped")
    OCCURRENCE_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIRE_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_FIELD_NUMBER: _ClassVar[int]
    DEAD_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    occurrence: int
    next_fire_at_ms: int
    delivered: int
    dead: int
    skipped: int
    def __init__(self, occurrence: _Optional[int] = ..., next_fire_at_ms: _Optional[int] = ..., delivered: _Optional[int] = ..., dead: _Optional[int] = ..., skipped: _Optional[int] = ...) -> None: ...

class AttemptInfo(_message.Message):
    __slots__ = ("attempt", "fire_id", "epoch", "attempt_index", "started_at_ms", "finished_at_ms", "outcome", "http_status", "latency_ms", "error")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    FIRE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_INDEX_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    HTTP_STATUS_FIELD_NUMBER: _ClassVar[int]
    CLASS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    fire_id: str
    epoch: int
    attempt_index: int
    started_at_ms: int
    finished_at_ms: int
    outcome: str
    http_status: int
    latency_ms: int
    error: str
    def __init__(self, attempt: _Optional[int] = ..., fire_id: _Optional[str] = ..., epoch: _Optional[int] = ..., attempt_index: _Optional[int] = ..., started_at_ms: _Optional[int] = ..., finished_at_ms: _Optional[int] = ..., outcome: _Optional[str] = ..., http_status: _Optional[int] = ..., latency_ms: _Optional[int] = ..., error: _Optional[str] = ..., **kwargs) -> None: ...

class FireInfo(_message.Message):
    __slots__ = ("fire_id", "epoch", "attempt", "fired_at_ms", "next_attempt_at_ms", "last_error", "dead_reason")
    FIRE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    FIRED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    NEXT_ATTEMPT_AT_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    DEAD_REASON_FIELD_NUMBER: _ClassVar[int]
    fire_id: str
    epoch: int
    attempt: int
    fired_at_ms: int
    next_attempt_at_ms: int
    last_error: str
    dead_reason: str
    def __init__(self, fire_id: _Optional[str] = ..., epoch: _Optional[int] = ..., attempt: _Optional[int] = ..., fired_at_ms: _Optional[int] = ..., next_attempt_at_ms: _Optional[int] = ..., last_error: _Optional[str] = ..., dead_reason: _Optional[str] = ...) -> None: ...

class Callback(_message.Message):
    __slots__ = ("webhook", "pull", "amqp")
    WEBHOOK_FIELD_NUMBER: _ClassVar[int]
    PULL_FIELD_NUMBER: _ClassVar[int]
    AMQP_FIELD_NUMBER: _ClassVar[int]
    webhook: Webhook
    pull: Pull
    amqp: Amqp
    def __init__(self, webhook: _Optional[_Union[Webhook, _Mapping]] = ..., pull: _Optional[_Union[Pull, _Mapping]] = ..., amqp: _Optional[_Union[Amqp, _Mapping]] = ...) -> None: ...

class Amqp(_message.Message):
    __slots__ = ("broker", "exchange", "routing_key")
    BROKER_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_FIELD_NUMBER: _ClassVar[int]
    ROUTING_KEY_FIELD_NUMBER: _ClassVar[int]
    broker: str
    exchange: str
    routing_key: str
    def __init__(self, broker: _Optional[str] = ..., exchange: _Optional[str] = ..., routing_key: _Optional[str] = ...) -> None: ...

class Webhook(_message.Message):
    __slots__ = ("url",)
    URL_FIELD_NUMBER: _ClassVar[int]
    url: str
    def __init__(self, url: _Optional[str] = ...) -> None: ...

class Pull(_message.Message):
    __slots__ = ("topic", "ttr_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TTR_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    ttr_ms: int
    def __init__(self, topic: _Optional[str] = ..., ttr_ms: _Optional[int] = ...) -> None: ...

class RetryPolicy(_message.Message):
    __slots__ = ("max_attempts", "initial_backoff_ms", "max_backoff_ms", "give_up_after_ms")
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    INITIAL_BACKOFF_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_BACKOFF_MS_FIELD_NUMBER: _ClassVar[int]
    GIVE_UP_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    max_attempts: int
    initial_backoff_ms: int
    max_backoff_ms: int
    give_up_after_ms: int
    def __init__(self, max_attempts: _Optional[int] = ..., initial_backoff_ms: _Optional[int] = ..., max_backoff_ms: _Optional[int] = ..., give_up_after_ms: _Optional[int] = ...) -> None: ...

class CreateTimerRequest(_message.Message):
    __slots__ = ("namespace", "id", "fire_at_ms", "delay_ms", "payload", "labels", "callback", "retry", "replace_finished", "skip_if_late_ms", "recurrence")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    FIRE_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CALLBACK_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FINISHED_FIELD_NUMBER: _ClassVar[int]
    SKIP_IF_LATE_MS_FIELD_NUMBER: _ClassVar[int]
    RECURRENCE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    id: str
    fire_at_ms: int
    delay_ms: int
    payload: bytes
    labels: _containers.ScalarMap[str, str]
    callback: Callback
    retry: RetryPolicy
    replace_finished: bool
    skip_if_late_ms: int
    recurrence: Recurrence
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., fire_at_ms: _Optional[int] = ..., delay_ms: _Optional[int] = ..., payload: _Optional[bytes] = ..., labels: _Optional[_Mapping[str, str]] = ..., callback: _Optional[_Union[Callback, _Mapping]] = ..., retry: _Optional[_Union[RetryPolicy, _Mapping]] = ..., replace_finished: bool = ..., skip_if_late_ms: _Optional[int] = ..., recurrence: _Optional[_Union[Recurrence, _Mapping]] = ...) -> None: ...

class CreateTimerResponse(_message.Message):
    __slots__ = ("timer", "created")
    TIMER_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    timer: Timer
    created: bool
    def __init__(self, timer: _Optional[_Union[Timer, _Mapping]] = ..., created: bool = ...) -> None: ...

class CreateTimersRequest(_message.Message):
    __slots__ = ("timers",)
    TIMERS_FIELD_NUMBER: _ClassVar[int]
    timers: _containers.RepeatedCompositeFieldContainer[CreateTimerRequest]
    def __init__(self, timers: _Optional[_Iterable[_Union[CreateTimerRequest, _Mapping]]] = ...) -> None: ...

class CreateTimersResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[CreateTimerResult]
    def __init__(self, results: _Optional[_Iterable[_Union[CreateTimerResult, _Mapping]]] = ...) -> None: ...

class CreateTimerResult(_message.Message):
    __slots__ = ("ok", "error")
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ok: CreateTimerResponse
    error: ErrorInfo
    def __init__(self, ok: _Optional[_Union[CreateTimerResponse, _Mapping]] = ..., error: _Optional[_Union[ErrorInfo, _Mapping]] = ...) -> None: ...

class GetTimerRequest(_message.Message):
    __slots__ = ("namespace", "id", "include_attempts")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    id: str
    include_attempts: bool
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., include_attempts: bool = ...) -> None: ...

class GetTimerResponse(_message.Message):
    __slots__ = ("timer",)
    TIMER_FIELD_NUMBER: _ClassVar[int]
    timer: Timer
    def __init__(self, timer: _Optional[_Union[Timer, _Mapping]] = ...) -> None: ...

class ListTimersRequest(_message.Message):
    __slots__ = ("namespace", "state", "fire_after_ms", "fire_before_ms", "page_size", "page_token", "dead_reason")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FIRE_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    FIRE_BEFORE_MS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    DEAD_REASON_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    state: Timer.State
    fire_after_ms: int
    fire_before_ms: int
    page_size: int
    page_token: str
    dead_reason: str
    def __init__(self, namespace: _Optional[str] = ..., state: _Optional[_Union[Timer.State, str]] = ..., fire_after_ms: _Optional[int] = ..., fire_before_ms: _Optional[int] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., dead_reason: _Optional[str] = ...) -> None: ...

class ListTimersResponse(_message.Message):
    __slots__ = ("timers", "next_page_token")
    TIMERS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    timers: _containers.RepeatedCompositeFieldContainer[Timer]
    next_page_token: str
    def __init__(self, timers: _Optional[_Iterable[_Union[Timer, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelTimerRequest(_message.Message):
    __slots__ = ("namespace", "id")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    id: str
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class CancelTimerResponse(_message.Message):
    __slots__ = ("outcome", "timer", "fire", "applied_index", "attempt_in_flight")
    class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OUTCOME_UNSPECIFIED: _ClassVar[CancelTimerResponse.Outcome]
        CANCELLED: _ClassVar[CancelTimerResponse.Outcome]
        ALREADY_CANCELLED: _ClassVar[CancelTimerResponse.Outcome]
        ALREADY_FIRED: _ClassVar[CancelTimerResponse.Outcome]
        NOT_FOUND: _ClassVar[CancelTimerResponse.Outcome]
        CANCELLED_WHILE_FIRING: _ClassVar[CancelTimerResponse.Outcome]
    OUTCOME_UNSPECIFIED: CancelTimerResponse.Outcome
    CANCELLED: CancelTimerResponse.Outcome
    ALREADY_CANCELLED: CancelTimerResponse.Outcome
    ALREADY_FIRED: CancelTimerResponse.Outcome
    NOT_FOUND: CancelTimerResponse.Outcome
    CANCELLED_WHILE_FIRING: CancelTimerResponse.Outcome
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    TIMER_FIELD_NUMBER: _ClassVar[int]
    FIRE_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    outcome: CancelTimerResponse.Outcome
    timer: Timer
    fire: FireInfo
    applied_index: int
    attempt_in_flight: bool
    def __init__(self, outcome: _Optional[_Union[CancelTimerResponse.Outcome, str]] = ..., timer: _Optional[_Union[Timer, _Mapping]] = ..., fire: _Optional[_Union[FireInfo, _Mapping]] = ..., applied_index: _Optional[int] = ..., attempt_in_flight: bool = ...) -> None: ...

class RedriveTimersRequest(_message.Message):
    __slots__ = ("namespace", "ids")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, namespace: _Optional[str] = ..., ids: _Optional[_Iterable[str]] = ...) -> None: ...

class RedriveTimersResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[RedriveResult]
    def __init__(self, results: _Optional[_Iterable[_Union[RedriveResult, _Mapping]]] = ...) -> None: ...

class RedriveResult(_message.Message):
    __slots__ = ("id", "outcome", "timer", "error")
    class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OUTCOME_UNSPECIFIED: _ClassVar[RedriveResult.Outcome]
        REDRIVEN: _ClassVar[RedriveResult.Outcome]
        NOT_DEAD: _ClassVar[RedriveResult.Outcome]
        NOT_FOUND: _ClassVar[RedriveResult.Outcome]
        FAILED: _ClassVar[RedriveResult.Outcome]
    OUTCOME_UNSPECIFIED: RedriveResult.Outcome
    REDRIVEN: RedriveResult.Outcome
    NOT_DEAD: RedriveResult.Outcome
    NOT_FOUND: RedriveResult.Outcome
    FAILED: RedriveResult.Outcome
    ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    TIMER_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: str
    outcome: RedriveResult.Outcome
    timer: Timer
    error: ErrorInfo
    def __init__(self, id: _Optional[str] = ..., outcome: _Optional[_Union[RedriveResult.Outcome, str]] = ..., timer: _Optional[_Union[Timer, _Mapping]] = ..., error: _Optional[_Union[ErrorInfo, _Mapping]] = ...) -> None: ...

class RescheduleTimerRequest(_message.Message):
    __slots__ = ("namespace", "id", "expected_generation", "fire_at_ms", "delay_ms")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_GENERATION_FIELD_NUMBER: _ClassVar[int]
    FIRE_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    id: str
    expected_generation: int
    fire_at_ms: int
    delay_ms: int
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., expected_generation: _Optional[int] = ..., fire_at_ms: _Optional[int] = ..., delay_ms: _Optional[int] = ...) -> None: ...

class RescheduleTimerResponse(_message.Message):
    __slots__ = ("timer",)
    TIMER_FIELD_NUMBER: _ClassVar[int]
    timer: Timer
    def __init__(self, timer: _Optional[_Union[Timer, _Mapping]] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("namespace", "id", "payload", "fire_at_ms", "fired_at_ms", "attempt", "shard", "epoch", "fire_id", "labels", "reserved_until_ms", "topic", "cluster_id", "late_by_ms", "occurrence")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    FIRE_AT_MS_FIELD_NUMBER: _ClassVar[int]
    FIRED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FIRE_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    RESERVED_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    LATE_BY_MS_FIELD_NUMBER: _ClassVar[int]
    OCCURRENCE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    id: str
    payload: bytes
    fire_at_ms: int
    fired_at_ms: int
    attempt: int
    shard: int
    epoch: int
    fire_id: str
    labels: _containers.ScalarMap[str, str]
    reserved_until_ms: int
    topic: str
    cluster_id: str
    late_by_ms: int
    occurrence: int
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., payload: _Optional[bytes] = ..., fire_at_ms: _Optional[int] = ..., fired_at_ms: _Optional[int] = ..., attempt: _Optional[int] = ..., shard: _Optional[int] = ..., epoch: _Optional[int] = ..., fire_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., reserved_until_ms: _Optional[int] = ..., topic: _Optional[str] = ..., cluster_id: _Optional[str] = ..., late_by_ms: _Optional[int] = ..., occurrence: _Optional[int] = ...) -> None: ...

class ReserveRequest(_message.Message):
    __slots__ = ("namespace", "topic", "ttr_ms", "max_batch", "max_in_flight")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TTR_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    topic: str
    ttr_ms: int
    max_batch: int
    max_in_flight: int
    def __init__(self, namespace: _Optional[str] = ..., topic: _Optional[str] = ..., ttr_ms: _Optional[int] = ..., max_batch: _Optional[int] = ..., max_in_flight: _Optional[int] = ...) -> None: ...

class ReserveResponse(_message.Message):
    __slots__ = ("deliveries",)
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    deliveries: _containers.RepeatedCompositeFieldContainer[Delivery]
    def __init__(self, deliveries: _Optional[_Iterable[_Union[Delivery, _Mapping]]] = ...) -> None: ...

class DeliveryRef(_message.Message):
    __slots__ = ("namespace", "id", "fire_id", "attempt")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    FIRE_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    id: str
    fire_id: str
    attempt: int
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., fire_id: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("deliveries",)
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    deliveries: _containers.RepeatedCompositeFieldContainer[DeliveryRef]
    def __init__(self, deliveries: _Optional[_Iterable[_Union[DeliveryRef, _Mapping]]] = ...) -> None: ...

class AckResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AckResult]
    def __init__(self, results: _Optional[_Iterable[_Union[AckResult, _Mapping]]] = ...) -> None: ...

class AckResult(_message.Message):
    __slots__ = ("status",)
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATUS_UNSPECIFIED: _ClassVar[AckResult.Status]
        OK: _ClassVar[AckResult.Status]
        STALE: _ClassVar[AckResult.Status]
        NOT_FOUND: _ClassVar[AckResult.Status]
    STATUS_UNSPECIFIED: AckResult.Status
    OK: AckResult.Status
    STALE: AckResult.Status
    NOT_FOUND: AckResult.Status
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: AckResult.Status
    def __init__(self, status: _Optional[_Union[AckResult.Status, str]] = ...) -> None: ...

class NackRequest(_message.Message):
    __slots__ = ("deliveries", "delay_ms", "reason")
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    deliveries: _containers.RepeatedCompositeFieldContainer[DeliveryRef]
    delay_ms: int
    reason: str
    def __init__(self, deliveries: _Optional[_Iterable[_Union[DeliveryRef, _Mapping]]] = ..., delay_ms: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class NackResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AckResult]
    def __init__(self, results: _Optional[_Iterable[_Union[AckResult, _Mapping]]] = ...) -> None: ...

class GetHorizonRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class GetHorizonResponse(_message.Message):
    __slots__ = ("as_of_ms", "overdue", "next_minute", "next_hour", "next_day", "bucket_ms", "next_hour_by_minute")
    AS_OF_MS_FIELD_NUMBER: _ClassVar[int]
    OVERDUE_FIELD_NUMBER: _ClassVar[int]
    NEXT_MINUTE_FIELD_NUMBER: _ClassVar[int]
    NEXT_HOUR_FIELD_NUMBER: _ClassVar[int]
    NEXT_DAY_FIELD_NUMBER: _ClassVar[int]
    BUCKET_MS_FIELD_NUMBER: _ClassVar[int]
    NEXT_HOUR_BY_MINUTE_FIELD_NUMBER: _ClassVar[int]
    as_of_ms: int
    overdue: int
    next_minute: int
    next_hour: int
    next_day: int
    bucket_ms: int
    next_hour_by_minute: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, as_of_ms: _Optional[int] = ..., overdue: _Optional[int] = ..., next_minute: _Optional[int] = ..., next_hour: _Optional[int] = ..., next_day: _Optional[int] = ..., bucket_ms: _Optional[int] = ..., next_hour_by_minute: _Optional[_Iterable[int]] = ...) -> None: ...

class ErrorInfo(_message.Message):
    __slots__ = ("code", "message", "field", "leader", "map_epoch", "retry_after_ms", "reason")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    MAP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    field: str
    leader: LeaderHint
    map_epoch: int
    retry_after_ms: int
    reason: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., field: _Optional[str] = ..., leader: _Optional[_Union[LeaderHint, _Mapping]] = ..., map_epoch: _Optional[int] = ..., retry_after_ms: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class LeaderHint(_message.Message):
    __slots__ = ("shard", "node_id", "grpc_addr", "http_addr")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDR_FIELD_NUMBER: _ClassVar[int]
    HTTP_ADDR_FIELD_NUMBER: _ClassVar[int]
    shard: int
    node_id: int
    grpc_addr: str
    http_addr: str
    def __init__(self, shard: _Optional[int] = ..., node_id: _Optional[int] = ..., grpc_addr: _Optional[str] = ..., http_addr: _Optional[str] = ...) -> None: ...
