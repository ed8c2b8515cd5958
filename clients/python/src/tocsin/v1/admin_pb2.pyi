from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetClusterRequest(_message.Message):
    __slots__ = ("digests",)
    DIGESTS_FIELD_NUMBER: _ClassVar[int]
    digests: bool
    def __init__(self, digests: bool = ...) -> None: ...

class ClusterInfo(_message.Message):
    __slots__ = ("node_id", "map_epoch", "num_shards", "nodes", "shards", "metadata", "cluster_id")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    MAP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    NUM_SHARDS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    map_epoch: int
    num_shards: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    shards: _containers.RepeatedCompositeFieldContainer[ShardStatus]
    metadata: MetadataStatus
    cluster_id: str
    def __init__(self, node_id: _Optional[int] = ..., map_epoch: _Optional[int] = ..., num_shards: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ..., shards: _Optional[_Iterable[_Union[ShardStatus, _Mapping]]] = ..., metadata: _Optional[_Union[MetadataStatus, _Mapping]] = ..., cluster_id: _Optional[str] = ...) -> None: ...

class MetadataStatus(_message.Message):
    __slots__ = ("voters", "leader", "term", "hosted", "committed_index", "applied_index", "nodes")
    VOTERS_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    HOSTED_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    voters: _containers.RepeatedScalarFieldContainer[int]
    leader: int
    term: int
    hosted: bool
    committed_index: int
    applied_index: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    def __init__(self, voters: _Optional[_Iterable[int]] = ..., leader: _Optional[int] = ..., term: _Optional[int] = ..., hosted: bool = ..., committed_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ...) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("node_id", "grpc_addr", "http_addr", "state", "reachable", "since_epoch", "peer_addr")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[NodeInfo.State]
        JOINING: _ClassVar[NodeInfo.State]
        ACTIVE: _ClassVar[NodeInfo.State]
        DRAINING: _ClassVar[NodeInfo.State]
        REMOVED: _ClassVar[NodeInfo.State]
    STATE_UNSPECIFIED: NodeInfo.State
    JOINING: NodeInfo.State
    ACTIVE: NodeInfo.State
    DRAINING: NodeInfo.State
    REMOVED: NodeInfo.State
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDR_FIELD_NUMBER: _ClassVar[int]
    HTTP_ADDR_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REACHABLE_FIELD_NUMBER: _ClassVar[int]
    SINCE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDR_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    grpc_addr: str
    http_addr: str
    state: NodeInfo.State
    reachable: bool
    since_epoch: int
    peer_addr: str
    def __init__(self, node_id: _Optional[int] = ..., grpc_addr: _Optional[str] = ..., http_addr: _Optional[str] = ..., state: _Optional[_Union[NodeInfo.State, str]] = ..., reachable: bool = ..., since_epoch: _Optional[int] = ..., peer_addr: _Optional[str] = ...) -> None: ...

class ShardStatus(_message.Message):
    __slots__ = ("shard", "replicas", "learners", "leader", "term", "epoch", "committed_index", "applied_index", "lag", "pending_timers", "firing_timers", "wheel_size", "lateness_ms_p99", "state_digest", "timer_count", "digest_applied_index", "target", "shard_epoch", "move_error", "snapshot_bytes_sent")
    class LagEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    SHARD_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    PENDING_TIMERS_FIELD_NUMBER: _ClassVar[int]
    FIRING_TIMERS_FIELD_NUMBER: _ClassVar[int]
    WHEEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    LATENESS_MS_P99_FIELD_NUMBER: _ClassVar[int]
    STATE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    TIMER_COUNT_FIELD_NUMBER: _ClassVar[int]
    DIGEST_APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    SHARD_EPOCH_FIELD_NUMBER: _ClassVar[int]
    MOVE_ERROR_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    shard: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    learners: _containers.RepeatedScalarFieldContainer[int]
    leader: int
    term: int
    epoch: int
    committed_index: int
    applied_index: int
    lag: _containers.ScalarMap[int, int]
    pending_timers: int
    firing_timers: int
    wheel_size: int
    lateness_ms_p99: int
    state_digest: int
    timer_count: int
    digest_applied_index: int
    target: _containers.RepeatedScalarFieldContainer[int]
    shard_epoch: int
    move_error: str
    snapshot_bytes_sent: int
    def __init__(self, shard: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ..., learners: _Optional[_Iterable[int]] = ..., leader: _Optional[int] = ..., term: _Optional[int] = ..., epoch: _Optional[int] = ..., committed_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., lag: _Optional[_Mapping[int, int]] = ..., pending_timers: _Optional[int] = ..., firing_timers: _Optional[int] = ..., wheel_size: _Optional[int] = ..., lateness_ms_p99: _Optional[int] = ..., state_digest: _Optional[int] = ..., timer_count: _Optional[int] = ..., digest_applied_index: _Optional[int] = ..., target: _Optional[_Iterable[int]] = ..., shard_epoch: _Optional[int] = ..., move_error: _Optional[str] = ..., snapshot_bytes_sent: _Optional[int] = ...) -> None: ...

class GetShardMapRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ShardMap(_message.Message):
    __slots__ = ("epoch", "num_shards", "nodes", "ring", "shards", "metadata")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NUM_SHARDS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    RING_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    num_shards: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    ring: _containers.RepeatedCompositeFieldContainer[RingToken]
    shards: _containers.RepeatedCompositeFieldContainer[ShardPlacement]
    metadata: MetadataStatus
    def __init__(self, epoch: _Optional[int] = ..., num_shards: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ..., ring: _Optional[_Iterable[_Union[RingToken, _Mapping]]] = ..., shards: _Optional[_Iterable[_Union[ShardPlacement, _Mapping]]] = ..., metadata: _Optional[_Union[MetadataStatus, _Mapping]] = ...) -> None: ...

class RingToken(_message.Message):
    __slots__ = ("token", "node_id")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    token: int
    node_id: int
    def __init__(self, token: _Optional[int] = ..., node_id: _Optional[int] = ...) -> None: ...

class ShardPlacement(_message.Message):
    __slots__ = ("shard", "replicas", "leader", "shard_epoch", "term", "learners", "membership_index", "target", "move_error", "snapshot_bytes_sent")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    SHARD_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    MEMBERSHIP_INDEX_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    MOVE_ERROR_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    shard: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    leader: int
    shard_epoch: int
    term: int
    learners: _containers.RepeatedScalarFieldContainer[int]
    membership_index: int
    target: _containers.RepeatedScalarFieldContainer[int]
    move_error: str
    snapshot_bytes_sent: int
    def __init__(self, shard: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ..., leader: _Optional[int] = ..., shard_epoch: _Optional[int] = ..., term: _Optional[int] = ..., learners: _Optional[_Iterable[int]] = ..., membership_index: _Optional[int] = ..., target: _Optional[_Iterable[int]] = ..., move_error: _Optional[str] = ..., snapshot_bytes_sent: _Optional[int] = ...) -> None: ...

class AddNodeRequest(_message.Message):
    __slots__ = ("grpc_addr", "http_addr", "peer_addr")
    GRPC_ADDR_FIELD_NUMBER: _ClassVar[int]
    HTTP_ADDR_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDR_FIELD_NUMBER: _ClassVar[int]
    grpc_addr: str
    http_addr: str
    peer_addr: str
    def __init__(self, grpc_addr: _Optional[str] = ..., http_addr: _Optional[str] = ..., peer_addr: _Optional[str] = ...) -> None: ...

class RemoveNodeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    def __init__(self, node_id: _Optional[int] = ...) -> None: ...

class DecommissionNodeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    def __init__(self, node_id: _Optional[int] = ...) -> None: ...

class MoveShardRequest(_message.Message):
    __slots__ = ("shard", "from_node", "to_node")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    FROM_NODE_FIELD_NUMBER: _ClassVar[int]
    TO_NODE_FIELD_NUMBER: _ClassVar[int]
    shard: int
    from_node: int
    to_node: int
    def __init__(self, shard: _Optional[int] = ..., from_node: _Optional[int] = ..., to_node: _Optional[int] = ...) -> None: ...

class TransferLeaderRequest(_message.Message):
    __slots__ = ("shard", "to_node")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    TO_NODE_FIELD_NUMBER: _ClassVar[int]
    shard: int
    to_node: int
    def __init__(self, shard: _Optional[int] = ..., to_node: _Optional[int] = ...) -> None: ...

class TransferLeaderResponse(_message.Message):
    __slots__ = ("leader",)
    LEADER_FIELD_NUMBER: _ClassVar[int]
    leader: int
    def __init__(self, leader: _Optional[int] = ...) -> None: ...

class RebalanceRequest(_message.Message):
    __slots__ = ("dry_run",)
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    dry_run: bool
    def __init__(self, dry_run: bool = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("step", "shards_done", "shards_total", "bytes_streamed", "eta_ms", "message", "done", "map_epoch")
    STEP_FIELD_NUMBER: _ClassVar[int]
    SHARDS_DONE_FIELD_NUMBER: _ClassVar[int]
    SHARDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_STREAMED_FIELD_NUMBER: _ClassVar[int]
    ETA_MS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    MAP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    step: str
    shards_done: int
    shards_total: int
    bytes_streamed: int
    eta_ms: int
    message: str
    done: bool
    map_epoch: int
    def __init__(self, step: _Optional[str] = ..., shards_done: _Optional[int] = ..., shards_total: _Optional[int] = ..., bytes_streamed: _Optional[int] = ..., eta_ms: _Optional[int] = ..., message: _Optional[str] = ..., done: bool = ..., map_epoch: _Optional[int] = ...) -> None: ...

class CreateTokenRequest(_message.Message):
    __slots__ = ("scopes", "namespaces", "label")
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    scopes: _containers.RepeatedScalarFieldContainer[str]
    namespaces: _containers.RepeatedScalarFieldContainer[str]
    label: str
    def __init__(self, scopes: _Optional[_Iterable[str]] = ..., namespaces: _Optional[_Iterable[str]] = ..., label: _Optional[str] = ...) -> None: ...

class CreateTokenResponse(_message.Message):
    __slots__ = ("id", "token", "map_epoch")
    ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    MAP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    id: str
    token: str
    map_epoch: int
    def __init__(self, id: _Optional[str] = ..., token: _Optional[str] = ..., map_epoch: _Optional[int] = ...) -> None: ...

class ListTokensRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TokenInfo(_message.Message):
    __slots__ = ("id", "scopes", "namespaces", "label", "created_at_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    id: str
    scopes: _containers.RepeatedScalarFieldContainer[str]
    namespaces: _containers.RepeatedScalarFieldContainer[str]
    label: str
    created_at_ms: int
    def __init__(self, id: _Optional[str] = ..., scopes: _Optional[_Iterable[str]] = ..., namespaces: _Optional[_Iterable[str]] = ..., label: _Optional[str] = ..., created_at_ms: _Optional[int] = ...) -> None: ...

class ListTokensResponse(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedCompositeFieldContainer[TokenInfo]
    def __init__(self, tokens: _Optional[_Iterable[_Union[TokenInfo, _Mapping]]] = ...) -> None: ...

class RevokeTokenRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class RevokeTokenResponse(_message.Message):
    __slots__ = ("revoked", "map_epoch")
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    MAP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    revoked: bool
    map_epoch: int
    def __init__(self, revoked: bool = ..., map_epoch: _Optional[int] = ...) -> None: ...

class NamespaceQuota(_message.Message):
    __slots__ = ("namespace", "max_pending", "creates_per_sec")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    MAX_PENDING_FIELD_NUMBER: _ClassVar[int]
    CREATES_PER_SEC_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    max_pending: int
    creates_per_sec: int
    def __init__(self, namespace: _Optional[str] = ..., max_pending: _Optional[int] = ..., creates_per_sec: _Optional[int] = ...) -> None: ...

class SetNamespaceQuotaRequest(_message.Message):
    __slots__ = ("quota",)
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    quota: NamespaceQuota
    def __init__(self, quota: _Optional[_Union[NamespaceQuota, _Mapping]] = ...) -> None: ...

class SetNamespaceQuotaResponse(_message.Message):
    __slots__ = ("changed", "map_epoch")
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    MAP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    map_epoch: int
    def __init__(self, changed: bool = ..., map_epoch: _Optional[int] = ...) -> None: ...

class ListNamespaceQuotasRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListNamespaceQuotasResponse(_message.Message):
    __slots__ = ("quotas",)
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    quotas: _containers.RepeatedCompositeFieldContainer[NamespaceQuota]
    def __init__(self, quotas: _Optional[_Iterable[_Union[NamespaceQuota, _Mapping]]] = ...) -> None: ...

class SetNamespaceSecretRequest(_message.Message):
    __slots__ = ("namespace", "action", "secret")
    class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ACTION_UNSPECIFIED: _ClassVar[SetNamespaceSecretRequest.Action]
        ACTION_ROTATE: _ClassVar[SetNamespaceSecretRequest.Action]
        ACTION_DROP_PREVIOUS: _ClassVar[SetNamespaceSecretRequest.Action]
        ACTION_CLEAR: _ClassVar[SetNamespaceSecretRequest.Action]
    ACTION_UNSPECIFIED: SetNamespaceSecretRequest.Action
    ACTION_ROTATE: SetNamespaceSecretRequest.Action
    ACTION_DROP_PREVIOUS: SetNamespaceSecretRequest.Action
    ACTION_CLEAR: SetNamespaceSecretRequest.Action
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    action: SetNamespaceSecretRequest.Action
    secret: str
    def __init__(self, namespace: _Optional[str] = ..., action: _Optional[_Union[SetNamespaceSecretRequest.Action, str]] = ..., secret: _Optional[str] = ...) -> None: ...

class SetNamespaceSecretResponse(_message.Message):
    __slots__ = ("changed", "map_epoch", "secret", "fingerprint")
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    MAP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    map_epoch: int
    secret: str
    fingerprint: str
    def __init__(self, changed: bool = ..., map_epoch: _Optional[int] = ..., secret: _Optional[str] = ..., fingerprint: _Optional[str] = ...) -> None: ...

class ListNamespaceSecretsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NamespaceSecretInfo(_message.Message):
    __slots__ = ("namespace", "fingerprints", "rotated_at_ms")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINTS_FIELD_NUMBER: _ClassVar[int]
    ROTATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    fingerprints: _containers.RepeatedScalarFieldContainer[str]
    rotated_at_ms: int
    def __init__(self, namespace: _Optional[str] = ..., fingerprints: _Optional[_Iterable[str]] = ..., rotated_at_ms: _Optional[int] = ...) -> None: ...

class ListNamespaceSecretsResponse(_message.Message):
    __slots__ = ("secrets",)
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    secrets: _containers.RepeatedCompositeFieldContainer[NamespaceSecretInfo]
    def __init__(self, secrets: _Optional[_Iterable[_Union[NamespaceSecretInfo, _Mapping]]] = ...) -> None: ...

class ListEndpointsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EndpointInfo(_message.Message):
    __slots__ = ("endpoint", "state", "failures_in_a_row", "held_until_ms", "in_flight")
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FAILURES_IN_A_ROW_FIELD_NUMBER: _ClassVar[int]
    HELD_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    endpoint: str
    state: str
    failures_in_a_row: int
    held_until_ms: int
    in_flight: int
    def __init__(self, endpoint: _Optional[str] = ..., state: _Optional[str] = ..., failures_in_a_row: _Optional[int] = ..., held_until_ms: _Optional[int] = ..., in_flight: _Optional[int] = ...) -> None: ...

class DisabledUrl(_message.Message):
    __slots__ = ("url", "disabled_at_ms", "by_timer")
    URL_FIELD_NUMBER: _ClassVar[int]
    DISABLED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    BY_TIMER_FIELD_NUMBER: _ClassVar[int]
    url: str
    disabled_at_ms: int
    by_timer: str
    def __init__(self, url: _Optional[str] = ..., disabled_at_ms: _Optional[int] = ..., by_timer: _Optional[str] = ...) -> None: ...

class ListEndpointsResponse(_message.Message):
    __slots__ = ("node_id", "endpoints", "disabled")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    DISABLED_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    endpoints: _containers.RepeatedCompositeFieldContainer[EndpointInfo]
    disabled: _containers.RepeatedCompositeFieldContainer[DisabledUrl]
    def __init__(self, node_id: _Optional[int] = ..., endpoints: _Optional[_Iterable[_Union[EndpointInfo, _Mapping]]] = ..., disabled: _Optional[_Iterable[_Union[DisabledUrl, _Mapping]]] = ...) -> None: ...

class EnableEndpointRequest(_message.Message):
    __slots__ = ("url",)
    URL_FIELD_NUMBER: _ClassVar[int]
    url: str
    def __init__(self, url: _Optional[str] = ...) -> None: ...

class EnableEndpointResponse(_message.Message):
    __slots__ = ("node_id", "was_disabled")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    WAS_DISABLED_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    was_disabled: bool
    def __init__(self, node_id: _Optional[int] = ..., was_disabled: bool = ...) -> None: ...

class SetPausedRequest(_message.Message):
    __slots__ = ("namespace", "endpoint", "paused")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    endpoint: str
    paused: bool
    def __init__(self, namespace: _Optional[str] = ..., endpoint: _Optional[str] = ..., paused: bool = ...) -> None: ...

class SetPausedResponse(_message.Message):
    __slots__ = ("changed", "map_epoch")
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    MAP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    map_epoch: int
    def __init__(self, changed: bool = ..., map_epoch: _Optional[int] = ...) -> None: ...

class ListPausedRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PausedInfo(_message.Message):
    __slots__ = ("name", "paused_at_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PAUSED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    paused_at_ms: int
    def __init__(self, name: _Optional[str] = ..., paused_at_ms: _Optional[int] = ...) -> None: ...

class ListPausedResponse(_message.Message):
    __slots__ = ("namespaces", "endpoints")
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    namespaces: _containers.RepeatedCompositeFieldContainer[PausedInfo]
    endpoints: _containers.RepeatedCompositeFieldContainer[PausedInfo]
    def __init__(self, namespaces: _Optional[_Iterable[_Union[PausedInfo, _Mapping]]] = ..., endpoints: _Optional[_Iterable[_Union[PausedInfo, _Mapping]]] = ...) -> None: ...
