"""The network as flows: fluid flows at max-min fair rates over every GPU's links (``flows.py``,
``fabric.py``), mirror-image ranks (``symmetry.py``) and nccl-tests' bus bandwidth. A peer of
the costs: the engine chooses between the two."""
