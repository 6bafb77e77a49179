from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubscriptionKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUBSCRIPTION_KIND_UNSPECIFIED: _ClassVar[SubscriptionKind]
    SUBSCRIPTION_KIND_DURABLE: _ClassVar[SubscriptionKind]
    SUBSCRIPTION_KIND_EXTERNAL: _ClassVar[SubscriptionKind]
SUBSCRIPTION_KIND_UNSPECIFIED: SubscriptionKind
SUBSCRIPTION_KIND_DURABLE: SubscriptionKind
SUBSCRIPTION_KIND_EXTERNAL: SubscriptionKind

class SnapshotId(_message.Message):
    __slots__ = ("region", "epoch", "counter")
    REGION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    region: str
    epoch: int
    counter: int
    def __init__(self, region: _Optional[str] = ..., epoch: _Optional[int] = ..., counter: _Optional[int] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ("id", "round", "catch_up")
    ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_FIELD_NUMBER: _ClassVar[int]
    id: SnapshotId
    round: int
    catch_up: bool
    def __init__(self, id: _Optional[_Union[SnapshotId, _Mapping]] = ..., round: _Optional[int] = ..., catch_up: _Optional[bool] = ...) -> None: ...

class SnapshotResponse(_message.Message):
    __slots__ = ("id", "round", "position")
    ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    id: SnapshotId
    round: int
    position: int
    def __init__(self, id: _Optional[_Union[SnapshotId, _Mapping]] = ..., round: _Optional[int] = ..., position: _Optional[int] = ...) -> None: ...

class CompletedSnapshot(_message.Message):
    __slots__ = ("id", "local_position", "positions", "started_unix_ms", "completed_unix_ms")
    class PositionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    LOCAL_POSITION_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    id: SnapshotId
    local_position: int
    positions: _containers.ScalarMap[str, int]
    started_unix_ms: int
    completed_unix_ms: int
    def __init__(self, id: _Optional[_Union[SnapshotId, _Mapping]] = ..., local_position: _Optional[int] = ..., positions: _Optional[_Mapping[str, int]] = ..., started_unix_ms: _Optional[int] = ..., completed_unix_ms: _Optional[int] = ...) -> None: ...

class SubscriptionUpdate(_message.Message):
    __slots__ = ("subscription", "kind", "snapshot_id", "local_position", "positions", "config", "progress", "progress_position", "consuming", "acked")
    class PositionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class ProgressEntry(_message.Message):
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
        value: OriginRanges
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[OriginRanges, _Mapping]] = ...) -> None: ...
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    LOCAL_POSITION_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_POSITION_FIELD_NUMBER: _ClassVar[int]
    CONSUMING_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    subscription: str
    kind: SubscriptionKind
    snapshot_id: SnapshotId
    local_position: int
    positions: _containers.ScalarMap[str, int]
    config: bytes
    progress: _containers.ScalarMap[str, int]
    progress_position: int
    consuming: bool
    acked: _containers.MessageMap[str, OriginRanges]
    def __init__(self, subscription: _Optional[str] = ..., kind: _Optional[_Union[SubscriptionKind, str]] = ..., snapshot_id: _Optional[_Union[SnapshotId, _Mapping]] = ..., local_position: _Optional[int] = ..., positions: _Optional[_Mapping[str, int]] = ..., config: _Optional[bytes] = ..., progress: _Optional[_Mapping[str, int]] = ..., progress_position: _Optional[int] = ..., consuming: _Optional[bool] = ..., acked: _Optional[_Mapping[str, OriginRanges]] = ...) -> None: ...

class OriginRanges(_message.Message):
    __slots__ = ("bounds",)
    BOUNDS_FIELD_NUMBER: _ClassVar[int]
    bounds: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, bounds: _Optional[_Iterable[int]] = ...) -> None: ...

class Marker(_message.Message):
    __slots__ = ("region", "stream", "epoch", "request", "response", "snapshot", "update")
    REGION_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    region: str
    stream: str
    epoch: int
    request: SnapshotRequest
    response: SnapshotResponse
    snapshot: CompletedSnapshot
    update: SubscriptionUpdate
    def __init__(self, region: _Optional[str] = ..., stream: _Optional[str] = ..., epoch: _Optional[int] = ..., request: _Optional[_Union[SnapshotRequest, _Mapping]] = ..., response: _Optional[_Union[SnapshotResponse, _Mapping]] = ..., snapshot: _Optional[_Union[CompletedSnapshot, _Mapping]] = ..., update: _Optional[_Union[SubscriptionUpdate, _Mapping]] = ...) -> None: ...
