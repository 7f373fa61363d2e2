"""Pipeline schedules: the registry (``schedules.py``), each shipped family, the chunk layout
each declares (``stages.py``) and list scheduling for schedules without a formula.

The families kept in modules of their own register themselves when this package loads, so that
importing any part of it (``schedules.SCHEDULES`` included) sees every shipped schedule.
"""

# interleaved first: the planner tries schedules in the order they were registered
from . import interleaved  # noqa: F401 # isort: skip
from . import dual_schedules, greedy_schedules, v_schedules  # noqa: F401
