"""MT-NLG 530B's three node counts against the model: is the gap per micro-batch or per step?
(issue 23, docs/accuracy.md "Where the gaps are")

    python3 benchmarks/mtnlg_scaling.py

Smith et al. 2022 (sec. 2.4) ran one split, TP 8 x PP 35, at three data-parallel widths with the
same global batch, so each pipeline got m = 1920 / DP micro-batches. A 1F1B step is m + PP - 1
micro-batch slots of the slowest stage plus what runs once a step (the gradient reduction, the
optimizer), so step = a (m + PP - 1) + c over the three runs separates a slot's time (a) from a
fixed time per step (c), for the published times and for the engine's predictions alike
(tests/data/heldout-a100-mtnlg.yaml, run as benchmarks/accuracy.py runs it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from clustersim.simulator.discrete_event.engine import simulate
from clustersim.validation import published as pub

TABLE = Path(__file__).resolve().parents[1] / "tests" / "data" / "heldout-a100-mtnlg.yaml"


def slot_and_fixed(slots: list[int], steps: list[float]) -> tuple[float, float]:
    """Least-squares a and c of step = a * slots + c."""
    a, c = np.polyfit(slots, steps, 1)
    return float(a), float(c)


def main() -> None:
    cases = pub.load_table(TABLE)
    slots, measured, predicted = [], [], []
    print(f"{'GPUs':>5s} {'slots':>5s} {'measured s':>10s} {'predicted s':>11s} {'error':>7s}")
    for case in cases:
        s = case.scenario
        m = s.training.global_batch // (s.parallel.dp * s.training.micro_batch)
        slots.append(m + s.parallel.pp - 1)
        measured.append(s.training.global_batch * s.model.seq_len / case.published)
        predicted.append(simulate(s, "representative").step_time_s)
        print(f"{s.cluster.gpus:5d} {slots[-1]:5d} {measured[-1]:10.2f} {predicted[-1]:11.2f} "
              f"{predicted[-1] / measured[-1] - 1:+7.1%}")
    print("step = a x slots + c")
    for name, steps in (("measured", measured), ("predicted", predicted)):
        a, c = slot_and_fixed(slots, steps)
        print(f"{name:10s} a {a * 1e3:6.1f} ms a slot, c {c:5.2f} s a step")


if __name__ == "__main__":
    main()
