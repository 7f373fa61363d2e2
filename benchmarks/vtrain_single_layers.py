"""vTrain's single-node runs, per layer and micro-batch: what the measured time grows by with
each layer, beside the engine's (issue 23, docs/accuracy.md "Where the gaps are").

    python3 benchmarks/vtrain_single_layers.py

tests/data/vtrain-single-node.yaml times every split of four depths (12, 16, 20 and 24 layers)
of one model width, so each split's time against its depth is a line whose slope, over the
micro-batches each rank runs, is one layer's forward, re-run and backward for one micro-batch:
the embedding, output layer, loss and optimizer stay in the intercept. The same slope of the
engine's predictions, and of its pieces: the host's floor under a layer (``host_layer_s``:
forward twice, with full recomputation, and backward) and the layer's kernels alone. Medians
over the splits without a pipeline, by tensor-parallel size, width and micro-batch.

Then, where the GPU decides (tp 1, micro-batches 4 and 8), what one more sequence adds to a
layer, and the share of the A100's 312 TFLOP/s (fp16) that is, counting a layer's forward as
24 s h^2 (1 + s / 6h) FLOPs per sequence (Narayanan et al. 2021, eq. 3 without the output
layer) three times (forward, backward) or four (a re-run forward too); beside it the engine's
kernels, with and without the re-run.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from clustersim.simulator.costs.cost_model import CostModel
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.validation import accuracy, devset, vtrain_single

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / vtrain_single.FILE


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of (layers, seconds)."""
    layers, seconds = zip(*points, strict=True)
    return statistics.linear_regression(layers, seconds).slope


A100_FP16_FLOPS = 312e12


def layer_pieces(raw: dict) -> tuple[float, float, float]:
    """(host floor, kernels alone, kernels without the re-run forward) of one layer and
    micro-batch."""
    cm = CostModel(build_scenario(raw))
    forward, backward = cm.passes
    host_forward, host_backward = cm.profile.host_layer_s
    kernels = (forward.total - forward.host_wait, backward.total - backward.host_wait)
    return 2 * host_forward + host_backward, 2 * kernels[0] + kernels[1], sum(kernels)


def layer_flops(hidden: int, seq: int) -> float:
    """One layer's forward FLOPs per sequence (Narayanan et al. 2021, eq. 3)."""
    return 24 * seq * hidden**2 * (1 + seq / (6 * hidden))


def main() -> None:
    runs = [r for r in vtrain_single.load_runs(DATA) if r.candidates[0]["parallel"]["pp"] == 1]
    results = devset.predict_runs(runs, accuracy.predictor("representative"))
    splits: dict[tuple, list[devset.DevResult]] = defaultdict(list)
    for r in results:
        raw = r.run.candidates[0]
        p, t = raw["parallel"], raw["training"]
        splits[(p["tp"], raw["model"]["hidden"], t["micro_batch"], p["dp"],
                t["global_batch"])].append(r)
    rows: dict[tuple, list[tuple[float, float, float, float]]] = defaultdict(list)
    for (tp, hidden, micro, dp, batch), depth in splits.items():
        if len({r.run.candidates[0]["model"]["layers"] for r in depth}) < 3:
            continue
        per_rank = batch // (dp * micro)
        measured = slope([(r.run.candidates[0]["model"]["layers"], r.run.published_s)
                          for r in depth]) / per_rank
        predicted = slope([(r.run.candidates[0]["model"]["layers"], r.predicted_s)
                           for r in depth]) / per_rank
        rows[(tp, hidden, micro)].append((measured, predicted,
                                          *layer_pieces(depth[0].run.candidates[0])))
    _per_layer(rows)
    print()
    _per_sequence(rows, seq=runs[0].candidates[0]["model"]["seq_len"])


def _per_layer(rows: dict) -> None:
    print("ms per layer and micro-batch (forward, re-run, backward); medians over the splits "
          "without a pipeline")
    print(f"{'tp':>3s} {'hidden':>6s} {'mbs':>4s} {'splits':>6s} {'measured':>9s} "
          f"{'engine':>7s} {'error':>7s} {'host floor':>10s} {'kernels':>8s}")
    for (tp, hidden, micro), values in sorted(rows.items()):
        m, p, host, kernels = (statistics.median(v[i] for v in values) for i in range(4))
        print(f"{tp:3d} {hidden:6d} {micro:4d} {len(values):6d} {1e3 * m:9.2f} {1e3 * p:7.2f} "
              f"{100 * (p / m - 1):+6.1f}% {1e3 * host:10.2f} {1e3 * kernels:8.2f}")


def _per_sequence(rows: dict, seq: int) -> None:
    print("tp 1, one more sequence per micro-batch (4 -> 8): ms per layer, and the share of "
          "peak it is")
    print(f"{'hidden':>6s} {'measured':>9s} {'x3 FLOPs':>9s} {'x4 FLOPs':>9s} "
          f"{'engine, re-run':>14s} {'engine, none':>12s}")
    for hidden in sorted({h for _, h, _ in rows}):
        at = {mb: [statistics.median(v[i] for v in rows[(1, hidden, mb)]) for i in range(5)]
              for mb in (4, 8)}
        measured, kernels, no_rerun = ((at[8][i] - at[4][i]) / 4 for i in (0, 3, 4))
        flops = layer_flops(hidden, seq)
        print(f"{hidden:6d} {1e3 * measured:9.2f} {3 * flops / measured / A100_FP16_FLOPS:9.0%} "
              f"{4 * flops / measured / A100_FP16_FLOPS:9.0%} {1e3 * kernels:14.2f} "
              f"{1e3 * no_rerun:12.2f}")


if __name__ == "__main__":
    main()
