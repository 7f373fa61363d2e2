"""The simulator: scenario specs, transformer workload, memory model and step-time estimators."""

# The schedules kept in modules of their own register themselves when the package loads, so
# that importing any part of it (``schedules.SCHEDULES`` included) sees every shipped schedule.
from . import dual_schedules, greedy_schedules, v_schedules  # noqa: F401
