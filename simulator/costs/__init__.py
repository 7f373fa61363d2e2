"""The cost model: one ``CostModel`` per scenario (per pool), holding the rates and link tiers,
and the cost modules both estimators read from it: compute, per-layer communication, memory,
ZeRO-3, traffic, a split backward, each chunk's work and the ``StepResult``."""
