"""clustersim: a discrete-event simulator of distributed LLM training clusters.

The code lives in four subpackages (DESIGN.md): ``clustersim.topologies`` (hardware data and
communication costs), ``clustersim.simulator`` (scenario specs, workload, memory, estimators),
``clustersim.validation`` (real runs with torch.distributed) and ``clustersim.reports`` (CLI,
sweeps, plots). Dependencies point one way: reports -> validation -> simulator -> topologies.
"""

__version__ = "0.1.0"
