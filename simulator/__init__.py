"""The simulator: scenario specs, transformer workload, memory model and step-time estimators."""
