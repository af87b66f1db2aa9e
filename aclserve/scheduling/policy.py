"""Queue and batching policy of one model version (validated on construction)."""
from __future__ import annotations

from dataclasses import dataclass, field

TIMEOUT_ACTIONS = ("reject", "delay")
# just_in_time: an instance's next batch is formed when its compute stream is about to need it
# (scheduling/formation.py); when_slot_free: as soon as one of its slots is free.
FORMATION_MODES = ("just_in_time", "when_slot_free")


@dataclass(frozen=True)
class QueuePolicy:
    """Per priority level. The timeout override: a request's own timeout applies only when
    `allow_timeout_override` is true and it is shorter than the default, or the default is 0
    (no timeout), where Triton ignores it (queue.timeout_seconds); under preserve_ordering it
    rejects, whatever `timeout_action` says (PriorityQueue._expire)."""

    max_queue_size: int | None = 0  # 0 = unbounded; None = auto, resolved when the model loads
    default_timeout_ms: float | None = 0.0  # 0 = no deadline; None = auto, as above
    timeout_action: str = "reject"  # reject | delay
    allow_timeout_override: bool = True
    # max_queue_size bounds the rows queued (the requests' batch dimensions), not the requests:
    # what `auto` resolves to (repository/overload.py), so that its deadline, the time to run the
    # queue in full batches, holds for requests of a full batch each too. Not a config key: a
    # number configured keeps Triton's meaning (requests).
    counts_rows: bool = False

    def __post_init__(self):
        if self.max_queue_size is not None and self.max_queue_size < 0:
            raise ValueError("max_queue_size must be >= 0")
        if self.default_timeout_ms is not None and self.default_timeout_ms < 0:
            raise ValueError("default_timeout_ms must be >= 0")
        if self.timeout_action not in TIMEOUT_ACTIONS:
            raise ValueError(f"timeout_action must be one of {', '.join(TIMEOUT_ACTIONS)}")


@dataclass(frozen=True)
class BatchingConfig:
    enabled: bool = True  # false: one request per run (for comparison benchmarks)
    # the configured cap on rows per batch (YAML: batching.max_batch_size, Triton's key); 0 = the
    # largest compiled gear. The batcher's batch_limit is the smaller of the two.
    batch_cap: int = 0
    max_queue_delay_ms: float = 1.0
    priority_levels: int = 3  # levels 1..N, 1 is the highest
    default_priority: int | None = None  # None (YAML auto): the middle level, default_level
    default_queue_policy: QueuePolicy = field(default_factory=QueuePolicy)
    priority_queue_policy: dict[int, QueuePolicy] = field(default_factory=dict)
    # the fields each level's entry sets itself (the others are default_queue_policy's); a level
    # not here sets them all. Only for layering configs (config/model.py): a model's own
    # default_queue_policy reaches what model_defaults' levels left unset. Not compared: the
    # policies above say how the model behaves.
    priority_queue_fields: dict[int, frozenset[str]] = field(default_factory=dict, compare=False, repr=False)
    # the keys the model's own config file gives (config/files.py), where a setting that cannot
    # apply to the model loaded fails its load only when its own file gives it, not model_defaults
    # (repository/served.py: a static model's max_batch_size). Not compared, as above.
    own_keys: frozenset[str] = field(default=frozenset(), compare=False, repr=False)
    preserve_ordering: bool = False
    batch_formation: str = "just_in_time"
    # Triton's priority_levels 0 (a config.pbtxt's dynamic_batching without levels): priorities off,
    # run as the one level above; /config shows 0 levels and default level 0, as Triton does (a
    # client taking priority_levels > 0 for "priorities on" was shown 1). Set by the pbtxt reader
    # alone (config/triton_config.py): aclserve's YAML has no such key, its one level is 1.
    priorities_off: bool = False

    def __post_init__(self):
        if self.batch_formation not in FORMATION_MODES:
            raise ValueError(f"batch_formation must be one of {', '.join(FORMATION_MODES)}")
        if self.batch_cap < 0:
            raise ValueError("max_batch_size must be >= 0")
        if self.max_queue_delay_ms < 0:
            raise ValueError("max_queue_delay_ms must be >= 0")
        if self.priority_levels < 1:
            raise ValueError("priority_levels must be >= 1")
        if self.default_priority is not None and not 1 <= self.default_priority <= self.priority_levels:
            raise ValueError(f"default_priority must be within 1..{self.priority_levels}")
        for level in self.priority_queue_policy:
            if not 1 <= level <= self.priority_levels:
                raise ValueError(f"priority_queue_policy level {level} is outside 1..{self.priority_levels}")
        if self.priorities_off and (self.priority_levels != 1 or self.priority_queue_policy):
            raise ValueError("priorities off runs one level, with no queue policy of its own")

    @property
    def default_level(self) -> int:
        """The level of requests without a priority: default_priority, or the middle level (2 of
        3, 1 of 1), so that fewer levels than the default's need no default_priority of their own."""
        return self.priority_levels // 2 + 1 if self.default_priority is None else self.default_priority

    def policy_for(self, level: int) -> QueuePolicy:
        return self.priority_queue_policy.get(level, self.default_queue_policy)

    def level_for(self, priority: int | None) -> int:
        """Priority 0, None or out of range falls back to the default level."""
        if priority is None or not 1 <= priority <= self.priority_levels:
            return self.default_level
        return priority
