"""The simulator: scenario specs, transformer workload, memory model and step-time estimators.

One subpackage per concept, imported one way (docs/architecture.md, "Layers inside the
simulator"); this package itself imports none of them.
"""
