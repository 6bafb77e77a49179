from sidecar._gen.rsub.v1 import markers_pb2 as _markers_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubscriptionState(_message.Message):
    __slots__ = ("stream", "subscription", "kind", "replicated", "mark_delete", "last_snapshot_id", "last_snapshot_local", "last_update_sent_unix_ms", "applied", "cached_snapshots", "mark_delete_read_unix_ms", "progress", "failover_exposure", "progress_sent", "progress_sent_position", "receives_markers", "consumed_in", "acked")
    class ProgressEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class ProgressSentEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class AckedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _markers_pb2.OriginRanges
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_markers_pb2.OriginRanges, _Mapping]] = ...) -> None: ...
    STREAM_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REPLICATED_FIELD_NUMBER: _ClassVar[int]
    MARK_DELETE_FIELD_NUMBER: _ClassVar[int]
    LAST_SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_SNAPSHOT_LOCAL_FIELD_NUMBER: _ClassVar[int]
    LAST_UPDATE_SENT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    CACHED_SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    MARK_DELETE_READ_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    FAILOVER_EXPOSURE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_SENT_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_SENT_POSITION_FIELD_NUMBER: _ClassVar[int]
    RECEIVES_MARKERS_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_IN_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    stream: str
    subscription: str
    kind: str
    replicated: bool
    mark_delete: int
    last_snapshot_id: str
    last_snapshot_local: int
    last_update_sent_unix_ms: int
    applied: _containers.RepeatedCompositeFieldContainer[AppliedUpdate]
    cached_snapshots: int
    mark_delete_read_unix_ms: int
    progress: _containers.ScalarMap[str, int]
    failover_exposure: int
    progress_sent: _containers.ScalarMap[str, int]
    progress_sent_position: int
    receives_markers: bool
    consumed_in: _containers.RepeatedScalarFieldContainer[str]
    acked: _containers.MessageMap[str, _markers_pb2.OriginRanges]
    def __init__(self, stream: _Optional[str] = ..., subscription: _Optional[str] = ..., kind: _Optional[str] = ..., replicated: _Optional[bool] = ..., mark_delete: _Optional[int] = ..., last_snapshot_id: _Optional[str] = ..., last_snapshot_local: _Optional[int] = ..., last_update_sent_unix_ms: _Optional[int] = ..., applied: _Optional[_Iterable[_Union[AppliedUpdate, _Mapping]]] = ..., cached_snapshots: _Optional[int] = ..., mark_delete_read_unix_ms: _Optional[int] = ..., progress: _Optional[_Mapping[str, int]] = ..., failover_exposure: _Optional[int] = ..., progress_sent: _Optional[_Mapping[str, int]] = ..., progress_sent_position: _Optional[int] = ..., receives_markers: _Optional[bool] = ..., consumed_in: _Optional[_Iterable[str]] = ..., acked: _Optional[_Mapping[str, _markers_pb2.OriginRanges]] = ...) -> None: ...

class AppliedUpdate(_message.Message):
    __slots__ = ("from_region", "snapshot_id", "position", "applied_unix_ms")
    FROM_REGION_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    APPLIED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    from_region: str
    snapshot_id: str
    position: int
    applied_unix_ms: int
    def __init__(self, from_region: _Optional[str] = ..., snapshot_id: _Optional[str] = ..., position: _Optional[int] = ..., applied_unix_ms: _Optional[int] = ...) -> None: ...

class SnapshotInfo(_message.Message):
    __slots__ = ("id", "stream", "local_position", "positions", "completed_unix_ms", "duration_ms")
    class PositionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    LOCAL_POSITION_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    id: str
    stream: str
    local_position: int
    positions: _containers.ScalarMap[str, int]
    completed_unix_ms: int
    duration_ms: int
    def __init__(self, id: _Optional[str] = ..., stream: _Optional[str] = ..., local_position: _Optional[int] = ..., positions: _Optional[_Mapping[str, int]] = ..., completed_unix_ms: _Optional[int] = ..., duration_ms: _Optional[int] = ...) -> None: ...

class GetSubscriptionRequest(_message.Message):
    __slots__ = ("stream", "subscription")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    stream: str
    subscription: str
    def __init__(self, stream: _Optional[str] = ..., subscription: _Optional[str] = ...) -> None: ...

class GetSubscriptionResponse(_message.Message):
    __slots__ = ("stream", "subscription", "kind", "replicated", "mark_delete", "last_snapshot_id", "last_snapshot_local", "last_update_sent_unix_ms", "applied", "cached_snapshots", "mark_delete_read_unix_ms", "progress", "failover_exposure", "progress_sent", "progress_sent_position", "receives_markers", "consumed_in", "acked")
    class ProgressEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class ProgressSentEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class AckedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _markers_pb2.OriginRanges
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_markers_pb2.OriginRanges, _Mapping]] = ...) -> None: ...
    STREAM_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REPLICATED_FIELD_NUMBER: _ClassVar[int]
    MARK_DELETE_FIELD_NUMBER: _ClassVar[int]
    LAST_SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_SNAPSHOT_LOCAL_FIELD_NUMBER: _ClassVar[int]
    LAST_UPDATE_SENT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    CACHED_SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    MARK_DELETE_READ_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    FAILOVER_EXPOSURE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_SENT_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_SENT_POSITION_FIELD_NUMBER: _ClassVar[int]
    RECEIVES_MARKERS_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_IN_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    stream: str
    subscription: str
    kind: str
    replicated: bool
    mark_delete: int
    last_snapshot_id: str
    last_snapshot_local: int
    last_update_sent_unix_ms: int
    applied: _containers.RepeatedCompositeFieldContainer[AppliedUpdate]
    cached_snapshots: int
    mark_delete_read_unix_ms: int
    progress: _containers.ScalarMap[str, int]
    failover_exposure: int
    progress_sent: _containers.ScalarMap[str, int]
    progress_sent_position: int
    receives_markers: bool
    consumed_in: _containers.RepeatedScalarFieldContainer[str]
    acked: _containers.MessageMap[str, _markers_pb2.OriginRanges]
    def __init__(self, stream: _Optional[str] = ..., subscription: _Optional[str] = ..., kind: _Optional[str] = ..., replicated: _Optional[bool] = ..., mark_delete: _Optional[int] = ..., last_snapshot_id: _Optional[str] = ..., last_snapshot_local: _Optional[int] = ..., last_update_sent_unix_ms: _Optional[int] = ..., applied: _Optional[_Iterable[_Union[AppliedUpdate, _Mapping]]] = ..., cached_snapshots: _Optional[int] = ..., mark_delete_read_unix_ms: _Optional[int] = ..., progress: _Optional[_Mapping[str, int]] = ..., failover_exposure: _Optional[int] = ..., progress_sent: _Optional[_Mapping[str, int]] = ..., progress_sent_position: _Optional[int] = ..., receives_markers: _Optional[bool] = ..., consumed_in: _Optional[_Iterable[str]] = ..., acked: _Optional[_Mapping[str, _markers_pb2.OriginRanges]] = ...) -> None: ...

class ListSubscriptionsRequest(_message.Message):
    __slots__ = ("stream",)
    STREAM_FIELD_NUMBER: _ClassVar[int]
    stream: str
    def __init__(self, stream: _Optional[str] = ...) -> None: ...

class ListSubscriptionsResponse(_message.Message):
    __slots__ = ("subscriptions",)
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    subscriptions: _containers.RepeatedCompositeFieldContainer[SubscriptionState]
    def __init__(self, subscriptions: _Optional[_Iterable[_Union[SubscriptionState, _Mapping]]] = ...) -> None: ...

class ListSnapshotsRequest(_message.Message):
    __slots__ = ("stream",)
    STREAM_FIELD_NUMBER: _ClassVar[int]
    stream: str
    def __init__(self, stream: _Optional[str] = ...) -> None: ...

class ListSnapshotsResponse(_message.Message):
    __slots__ = ("snapshots",)
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    snapshots: _containers.RepeatedCompositeFieldContainer[SnapshotInfo]
    def __init__(self, snapshots: _Optional[_Iterable[_Union[SnapshotInfo, _Mapping]]] = ...) -> None: ...

class WatchSubscriptionRequest(_message.Message):
    __slots__ = ("stream", "subscription")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    stream: str
    subscription: str
    def __init__(self, stream: _Optional[str] = ..., subscription: _Optional[str] = ...) -> None: ...

class WatchSubscriptionResponse(_message.Message):
    __slots__ = ("stream", "subscription", "kind", "replicated", "mark_delete", "last_snapshot_id", "last_snapshot_local", "last_update_sent_unix_ms", "applied", "cached_snapshots", "mark_delete_read_unix_ms", "progress", "failover_exposure", "progress_sent", "progress_sent_position", "receives_markers", "consumed_in", "acked")
    class ProgressEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class ProgressSentEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class AckedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _markers_pb2.OriginRanges
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_markers_pb2.OriginRanges, _Mapping]] = ...) -> None: ...
    STREAM_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REPLICATED_FIELD_NUMBER: _ClassVar[int]
    MARK_DELETE_FIELD_NUMBER: _ClassVar[int]
    LAST_SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_SNAPSHOT_LOCAL_FIELD_NUMBER: _ClassVar[int]
    LAST_UPDATE_SENT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    CACHED_SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    MARK_DELETE_READ_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    FAILOVER_EXPOSURE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_SENT_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_SENT_POSITION_FIELD_NUMBER: _ClassVar[int]
    RECEIVES_MARKERS_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_IN_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    stream: str
    subscription: str
    kind: str
    replicated: bool
    mark_delete: int
    last_snapshot_id: str
    last_snapshot_local: int
    last_update_sent_unix_ms: int
    applied: _containers.RepeatedCompositeFieldContainer[AppliedUpdate]
    cached_snapshots: int
    mark_delete_read_unix_ms: int
    progress: _containers.ScalarMap[str, int]
    failover_exposure: int
    progress_sent: _containers.ScalarMap[str, int]
    progress_sent_position: int
    receives_markers: bool
    consumed_in: _containers.RepeatedScalarFieldContainer[str]
    acked: _containers.MessageMap[str, _markers_pb2.OriginRanges]
    def __init__(self, stream: _Optional[str] = ..., subscription: _Optional[str] = ..., kind: _Optional[str] = ..., replicated: _Optional[bool] = ..., mark_delete: _Optional[int] = ..., last_snapshot_id: _Optional[str] = ..., last_snapshot_local: _Optional[int] = ..., last_update_sent_unix_ms: _Optional[int] = ..., applied: _Optional[_Iterable[_Union[AppliedUpdate, _Mapping]]] = ..., cached_snapshots: _Optional[int] = ..., mark_delete_read_unix_ms: _Optional[int] = ..., progress: _Optional[_Mapping[str, int]] = ..., failover_exposure: _Optional[int] = ..., progress_sent: _Optional[_Mapping[str, int]] = ..., progress_sent_position: _Optional[int] = ..., receives_markers: _Optional[bool] = ..., consumed_in: _Optional[_Iterable[str]] = ..., acked: _Optional[_Mapping[str, _markers_pb2.OriginRanges]] = ...) -> None: ...

class CommitCursorRequest(_message.Message):
    __slots__ = ("stream", "subscription", "sequence")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    stream: str
    subscription: str
    sequence: int
    def __init__(self, stream: _Optional[str] = ..., subscription: _Optional[str] = ..., sequence: _Optional[int] = ...) -> None: ...

class CommitCursorResponse(_message.Message):
    __slots__ = ("mark_delete",)
    MARK_DELETE_FIELD_NUMBER: _ClassVar[int]
    mark_delete: int
    def __init__(self, mark_delete: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SourceLink(_message.Message):
    __slots__ = ("origin_region", "active", "last_marker_age_ms", "lag_messages")
    ORIGIN_REGION_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    LAST_MARKER_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    LAG_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    origin_region: str
    active: bool
    last_marker_age_ms: int
    lag_messages: int
    def __init__(self, origin_region: _Optional[str] = ..., active: _Optional[bool] = ..., last_marker_age_ms: _Optional[int] = ..., lag_messages: _Optional[int] = ...) -> None: ...

class StreamStatus(_message.Message):
    __slots__ = ("stream", "write_stream", "read_stream", "last_snapshot_age_ms", "sources", "replicated_subscriptions", "snapshot_pending", "leader", "leader_epoch", "leads", "discovered", "rebuilding")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    WRITE_STREAM_FIELD_NUMBER: _ClassVar[int]
    READ_STREAM_FIELD_NUMBER: _ClassVar[int]
    LAST_SNAPSHOT_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    REPLICATED_SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_PENDING_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADS_FIELD_NUMBER: _ClassVar[int]
    DISCOVERED_FIELD_NUMBER: _ClassVar[int]
    REBUILDING_FIELD_NUMBER: _ClassVar[int]
    stream: str
    write_stream: str
    read_stream: str
    last_snapshot_age_ms: int
    sources: _containers.RepeatedCompositeFieldContainer[SourceLink]
    replicated_subscriptions: int
    snapshot_pending: bool
    leader: str
    leader_epoch: int
    leads: bool
    discovered: bool
    rebuilding: bool
    def __init__(self, stream: _Optional[str] = ..., write_stream: _Optional[str] = ..., read_stream: _Optional[str] = ..., last_snapshot_age_ms: _Optional[int] = ..., sources: _Optional[_Iterable[_Union[SourceLink, _Mapping]]] = ..., replicated_subscriptions: _Optional[int] = ..., snapshot_pending: _Optional[bool] = ..., leader: _Optional[str] = ..., leader_epoch: _Optional[int] = ..., leads: _Optional[bool] = ..., discovered: _Optional[bool] = ..., rebuilding: _Optional[bool] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("region", "regions", "leader", "epoch", "connected", "streams", "version", "holder")
    REGION_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    region: str
    regions: _containers.RepeatedScalarFieldContainer[str]
    leader: bool
    epoch: int
    connected: bool
    streams: _containers.RepeatedCompositeFieldContainer[StreamStatus]
    version: str
    holder: str
    def __init__(self, region: _Optional[str] = ..., regions: _Optional[_Iterable[str]] = ..., leader: _Optional[bool] = ..., epoch: _Optional[int] = ..., connected: _Optional[bool] = ..., streams: _Optional[_Iterable[_Union[StreamStatus, _Mapping]]] = ..., version: _Optional[str] = ..., holder: _Optional[str] = ...) -> None: ...

class ResetCursorRequest(_message.Message):
    __slots__ = ("stream", "subscription", "sequence")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    stream: str
    subscription: str
    sequence: int
    def __init__(self, stream: _Optional[str] = ..., subscription: _Optional[str] = ..., sequence: _Optional[int] = ...) -> None: ...

class ResetCursorResponse(_message.Message):
    __slots__ = ("previous_sequence", "sequence")
    PREVIOUS_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    previous_sequence: int
    sequence: int
    def __init__(self, previous_sequence: _Optional[int] = ..., sequence: _Optional[int] = ...) -> None: ...

class TriggerSnapshotRequest(_message.Message):
    __slots__ = ("stream",)
    STREAM_FIELD_NUMBER: _ClassVar[int]
    stream: str
    def __init__(self, stream: _Optional[str] = ...) -> None: ...

class TriggerSnapshotResponse(_message.Message):
    __slots__ = ("snapshot_id",)
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    def __init__(self, snapshot_id: _Optional[str] = ...) -> None: ...

class SetReplicatedRequest(_message.Message):
    __slots__ = ("stream", "subscription", "replicated")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    REPLICATED_FIELD_NUMBER: _ClassVar[int]
    stream: str
    subscription: str
    replicated: bool
    def __init__(self, stream: _Optional[str] = ..., subscription: _Optional[str] = ..., replicated: _Optional[bool] = ...) -> None: ...

class SetReplicatedResponse(_message.Message):
    __slots__ = ("subscription",)
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    subscription: SubscriptionState
    def __init__(self, subscription: _Optional[_Union[SubscriptionState, _Mapping]] = ...) -> None: ...
