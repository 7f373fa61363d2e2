"""The discrete-event engine: each rank's action lists run as SimPy processes over the cost
model's times, with pipeline transfers, gradient traffic, the steady-state shortcut and the
walk (``engine.py:simulate``). A peer of the closed form; neither imports the other."""
