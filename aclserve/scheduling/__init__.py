"""Priority queueing and dynamic batching in front of a model version's executor."""
from .batcher import DynamicBatcher
from .clock import Clock, LoopClock
from .gears import GearPlanner, batch_limit
from .policy import BatchingConfig, QueuePolicy
from .queue import PriorityQueue, timeout_seconds
from .request import InferenceResult, QueuedRequest, answered_before_cancel, mark_answered
from .stats import BatcherStats

__all__ = ["BatcherStats", "BatchingConfig", "Clock", "DynamicBatcher", "GearPlanner",
           "InferenceResult", "LoopClock", "PriorityQueue", "QueuePolicy", "QueuedRequest",
           "answered_before_cancel", "batch_limit", "mark_answered", "timeout_seconds"]
