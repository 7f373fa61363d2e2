"""clustersim: a discrete-event simulator of distributed LLM training clusters.

The code lives in four subpackages (DESIGN.md): ``clustersim.topologies`` (hardware data and
communication costs), ``clustersim.simulator`` (scenario specs, workload, memory, estimators),
``clustersim.validation`` (real runs with torch.distributed) and ``clustersim.reports`` (tables,
sweeps, the planner, plots); the command line, ``clustersim.cli``, sits on top of them.
Dependencies point one way: cli -> reports -> validation -> simulator -> topologies.

The Python API (``clustersim.api``): ``simulate``, ``plan`` and ``load_scenario``; bad input
raises ``ScenarioError``. Importing clustersim loads none of the engine, pandas or matplotlib.
"""

from .api import load_scenario, plan, simulate
from .errors import ScenarioError
from .version import __version__

__all__ = ["ScenarioError", "__version__", "load_scenario", "plan", "simulate"]
