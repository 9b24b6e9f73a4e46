from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Purpose(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PURPOSE_UNSPECIFIED: _ClassVar[Purpose]
    PURPOSE_INIT_SCORE: _ClassVar[Purpose]
    PURPOSE_TREE: _ClassVar[Purpose]
    PURPOSE_LEVEL: _ClassVar[Purpose]
    PURPOSE_EVAL: _ClassVar[Purpose]
    PURPOSE_SKETCH: _ClassVar[Purpose]

class ReportKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPORT_UNSPECIFIED: _ClassVar[ReportKind]
    REPORT_PROGRESS: _ClassVar[ReportKind]
    REPORT_REFUSED: _ClassVar[ReportKind]
    REPORT_FINISHED: _ClassVar[ReportKind]
PURPOSE_UNSPECIFIED: Purpose
PURPOSE_INIT_SCORE: Purpose
PURPOSE_TREE: Purpose
PURPOSE_LEVEL: Purpose
PURPOSE_EVAL: Purpose
PURPOSE_SKETCH: Purpose
REPORT_UNSPECIFIED: ReportKind
REPORT_PROGRESS: ReportKind
REPORT_REFUSED: ReportKind
REPORT_FINISHED: ReportKind

class GetPlanRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetPlanResponse(_message.Message):
    __slots__ = ("plan", "plan_sha256")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    PLAN_SHA256_FIELD_NUMBER: _ClassVar[int]
    plan: bytes
    plan_sha256: str
    def __init__(self, plan: _Optional[bytes] = ..., plan_sha256: _Optional[str] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("plan_sha256", "site_id", "nonce", "signature", "trees_applied")
    PLAN_SHA256_FIELD_NUMBER: _ClassVar[int]
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    TREES_APPLIED_FIELD_NUMBER: _ClassVar[int]
    plan_sha256: str
    site_id: str
    nonce: bytes
    signature: bytes
    trees_applied: int
    def __init__(self, plan_sha256: _Optional[str] = ..., site_id: _Optional[str] = ..., nonce: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., trees_applied: _Optional[int] = ...) -> None: ...

class JoinResponse(_message.Message):
    __slots__ = ("token", "incarnation", "trees_released")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    TREES_RELEASED_FIELD_NUMBER: _ClassVar[int]
    token: bytes
    incarnation: bytes
    trees_released: int
    def __init__(self, token: _Optional[bytes] = ..., incarnation: _Optional[bytes] = ..., trees_released: _Optional[int] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("site_id", "token", "after_seq")
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    token: bytes
    after_seq: int
    def __init__(self, site_id: _Optional[str] = ..., token: _Optional[bytes] = ..., after_seq: _Optional[int] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("seq", "setup", "round_start", "round", "init_score", "tree", "finished", "aborted")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SETUP_FIELD_NUMBER: _ClassVar[int]
    ROUND_START_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    INIT_SCORE_FIELD_NUMBER: _ClassVar[int]
    TREE_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    seq: int
    setup: SecAggMessage
    round_start: RoundStart
    round: SecAggMessage
    init_score: InitScore
    tree: TreeRecord
    finished: Finished
    aborted: Aborted
    def __init__(self, seq: _Optional[int] = ..., setup: _Optional[_Union[SecAggMessage, _Mapping]] = ..., round_start: _Optional[_Union[RoundStart, _Mapping]] = ..., round: _Optional[_Union[SecAggMessage, _Mapping]] = ..., init_score: _Optional[_Union[InitScore, _Mapping]] = ..., tree: _Optional[_Union[TreeRecord, _Mapping]] = ..., finished: _Optional[_Union[Finished, _Mapping]] = ..., aborted: _Optional[_Union[Aborted, _Mapping]] = ...) -> None: ...

class SecAggMessage(_message.Message):
    __slots__ = ("secagg",)
    SECAGG_FIELD_NUMBER: _ClassVar[int]
    secagg: bytes
    def __init__(self, secagg: _Optional[bytes] = ...) -> None: ...

class SiteMessage(_message.Message):
    __slots__ = ("subscribe", "setup", "input", "round", "report")
    SUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    SETUP_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    subscribe: SubscribeRequest
    setup: SecAggSubmission
    input: MaskedInputSubmission
    round: SecAggSubmission
    report: ReportRequest
    def __init__(self, subscribe: _Optional[_Union[SubscribeRequest, _Mapping]] = ..., setup: _Optional[_Union[SecAggSubmission, _Mapping]] = ..., input: _Optional[_Union[MaskedInputSubmission, _Mapping]] = ..., round: _Optional[_Union[SecAggSubmission, _Mapping]] = ..., report: _Optional[_Union[ReportRequest, _Mapping]] = ...) -> None: ...

class EventBatch(_message.Message):
    __slots__ = ("events", "processed", "rejected")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    PROCESSED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    processed: int
    rejected: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., processed: _Optional[int] = ..., rejected: _Optional[_Iterable[str]] = ...) -> None: ...

class RoundStart(_message.Message):
    __slots__ = ("purpose", "tree", "secagg", "level", "features", "thresholds", "sketch")
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    TREE_FIELD_NUMBER: _ClassVar[int]
    SECAGG_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    THRESHOLDS_FIELD_NUMBER: _ClassVar[int]
    SKETCH_FIELD_NUMBER: _ClassVar[int]
    purpose: Purpose
    tree: int
    secagg: bytes
    level: int
    features: _containers.RepeatedScalarFieldContainer[int]
    thresholds: _containers.RepeatedScalarFieldContainer[float]
    sketch: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, purpose: _Optional[_Union[Purpose, str]] = ..., tree: _Optional[int] = ..., secagg: _Optional[bytes] = ..., level: _Optional[int] = ..., features: _Optional[_Iterable[int]] = ..., thresholds: _Optional[_Iterable[float]] = ..., sketch: _Optional[_Iterable[int]] = ...) -> None: ...

class InitScore(_message.Message):
    __slots__ = ("score", "round_id", "sites", "scores")
    SCORE_FIELD_NUMBER: _ClassVar[int]
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    SITES_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    score: float
    round_id: int
    sites: _containers.RepeatedScalarFieldContainer[str]
    scores: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, score: _Optional[float] = ..., round_id: _Optional[int] = ..., sites: _Optional[_Iterable[str]] = ..., scores: _Optional[_Iterable[float]] = ...) -> None: ...

class TreeRecord(_message.Message):
    __slots__ = ("index", "round_id", "sites", "features", "thresholds", "leaves")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    SITES_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    THRESHOLDS_FIELD_NUMBER: _ClassVar[int]
    LEAVES_FIELD_NUMBER: _ClassVar[int]
    index: int
    round_id: int
    sites: _containers.RepeatedScalarFieldContainer[str]
    features: _containers.RepeatedScalarFieldContainer[int]
    thresholds: _containers.RepeatedScalarFieldContainer[float]
    leaves: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, index: _Optional[int] = ..., round_id: _Optional[int] = ..., sites: _Optional[_Iterable[str]] = ..., features: _Optional[_Iterable[int]] = ..., thresholds: _Optional[_Iterable[float]] = ..., leaves: _Optional[_Iterable[float]] = ...) -> None: ...

class Finished(_message.Message):
    __slots__ = ("model_sha256", "trees", "evaluation")
    MODEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    TREES_FIELD_NUMBER: _ClassVar[int]
    EVALUATION_FIELD_NUMBER: _ClassVar[int]
    model_sha256: str
    trees: int
    evaluation: EvaluationRelease
    def __init__(self, model_sha256: _Optional[str] = ..., trees: _Optional[int] = ..., evaluation: _Optional[_Union[EvaluationRelease, _Mapping]] = ...) -> None: ...

class EvaluationRelease(_message.Message):
    __slots__ = ("sum", "sites", "round_id", "failed")
    SUM_FIELD_NUMBER: _ClassVar[int]
    SITES_FIELD_NUMBER: _ClassVar[int]
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    sum: _containers.RepeatedScalarFieldContainer[int]
    sites: _containers.RepeatedScalarFieldContainer[str]
    round_id: int
    failed: str
    def __init__(self, sum: _Optional[_Iterable[int]] = ..., sites: _Optional[_Iterable[str]] = ..., round_id: _Optional[int] = ..., failed: _Optional[str] = ...) -> None: ...

class Aborted(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class SecAggSubmission(_message.Message):
    __slots__ = ("site_id", "token", "secagg")
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SECAGG_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    token: bytes
    secagg: bytes
    def __init__(self, site_id: _Optional[str] = ..., token: _Optional[bytes] = ..., secagg: _Optional[bytes] = ...) -> None: ...

class MaskedInputSubmission(_message.Message):
    __slots__ = ("site_id", "token", "purpose", "tree", "secagg")
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    TREE_FIELD_NUMBER: _ClassVar[int]
    SECAGG_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    token: bytes
    purpose: Purpose
    tree: int
    secagg: bytes
    def __init__(self, site_id: _Optional[str] = ..., token: _Optional[bytes] = ..., purpose: _Optional[_Union[Purpose, str]] = ..., tree: _Optional[int] = ..., secagg: _Optional[bytes] = ...) -> None: ...

class SubmitResponse(_message.Message):
    __slots__ = ("accepted", "detail")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    detail: str
    def __init__(self, accepted: _Optional[bool] = ..., detail: _Optional[str] = ...) -> None: ...

class GetTreesRequest(_message.Message):
    __slots__ = ("from_index", "max_trees")
    FROM_INDEX_FIELD_NUMBER: _ClassVar[int]
    MAX_TREES_FIELD_NUMBER: _ClassVar[int]
    from_index: int
    max_trees: int
    def __init__(self, from_index: _Optional[int] = ..., max_trees: _Optional[int] = ...) -> None: ...

class GetTreesResponse(_message.Message):
    __slots__ = ("has_init_score", "init_score", "trees", "trees_released", "trees_total", "model_sha256")
    HAS_INIT_SCORE_FIELD_NUMBER: _ClassVar[int]
    INIT_SCORE_FIELD_NUMBER: _ClassVar[int]
    TREES_FIELD_NUMBER: _ClassVar[int]
    TREES_RELEASED_FIELD_NUMBER: _ClassVar[int]
    TREES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MODEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    has_init_score: bool
    init_score: InitScore
    trees: _containers.RepeatedCompositeFieldContainer[TreeRecord]
    trees_released: int
    trees_total: int
    model_sha256: str
    def __init__(self, has_init_score: _Optional[bool] = ..., init_score: _Optional[_Union[InitScore, _Mapping]] = ..., trees: _Optional[_Iterable[_Union[TreeRecord, _Mapping]]] = ..., trees_released: _Optional[int] = ..., trees_total: _Optional[int] = ..., model_sha256: _Optional[str] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SiteStatus(_message.Message):
    __slots__ = ("site_id", "connected", "eligible", "trees_applied", "note")
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    ELIGIBLE_FIELD_NUMBER: _ClassVar[int]
    TREES_APPLIED_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    connected: bool
    eligible: bool
    trees_applied: int
    note: str
    def __init__(self, site_id: _Optional[str] = ..., connected: _Optional[bool] = ..., eligible: _Optional[bool] = ..., trees_applied: _Optional[int] = ..., note: _Optional[str] = ...) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("stage", "plan_sha256", "trees_released", "trees_total", "rounds_failed", "sites", "model_sha256", "detail")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    PLAN_SHA256_FIELD_NUMBER: _ClassVar[int]
    TREES_RELEASED_FIELD_NUMBER: _ClassVar[int]
    TREES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FAILED_FIELD_NUMBER: _ClassVar[int]
    SITES_FIELD_NUMBER: _ClassVar[int]
    MODEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    stage: str
    plan_sha256: str
    trees_released: int
    trees_total: int
    rounds_failed: int
    sites: _containers.RepeatedCompositeFieldContainer[SiteStatus]
    model_sha256: str
    detail: str
    def __init__(self, stage: _Optional[str] = ..., plan_sha256: _Optional[str] = ..., trees_released: _Optional[int] = ..., trees_total: _Optional[int] = ..., rounds_failed: _Optional[int] = ..., sites: _Optional[_Iterable[_Union[SiteStatus, _Mapping]]] = ..., model_sha256: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("site_id", "token", "kind", "trees_applied", "detail", "model_sha256", "round_id")
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TREES_APPLIED_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    MODEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    token: bytes
    kind: ReportKind
    trees_applied: int
    detail: str
    model_sha256: str
    round_id: int
    def __init__(self, site_id: _Optional[str] = ..., token: _Optional[bytes] = ..., kind: _Optional[_Union[ReportKind, str]] = ..., trees_applied: _Optional[int] = ..., detail: _Optional[str] = ..., model_sha256: _Optional[str] = ..., round_id: _Optional[int] = ...) -> None: ...

class ReportResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
