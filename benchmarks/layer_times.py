"""One transformer layer's published forward and backward times beside the cost model's (held out).

    python benchmarks/layer_times.py

Korthikanti et al. 2022, Table 4: the 22B model's layer (tensor parallel 8, micro-batch 4,
sequence 2048) on Selene's A100s, timed five ways. Each row prints the published and predicted
forward, backward, combined time and the overhead over the first row; the overheads check what
the model charges for sequence parallelism and recomputation, the combined times the A100
profile's level (``tests/data/layer-times-korthikanti2022.yaml``; docs/accuracy.md).
"""

from __future__ import annotations

from pathlib import Path

from clustersim.validation.layer_times import compare, load_timings, overhead

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "layer-times-korthikanti2022.yaml"


def main() -> None:
    rows = compare(load_timings(DATA))
    base_published, base_predicted = rows[0].timing.combined_ms, rows[0].combined_ms
    print("Korthikanti et al. 2022, Table 4: one layer of the 22B model (tp 8, micro-batch 4, "
          "sequence 2048, A100 80GB), ms; published / predicted")
    print(f"{'experiment':24s} {'forward':>13s} {'backward':>13s} {'combined':>13s} "
          f"{'overhead':>15s} {'error':>7s}")
    for row in rows:
        t = row.timing
        print(f"{t.experiment:24s} {t.forward_ms:5.1f} / {row.forward_ms:5.2f} "
              f"{t.backward_ms:5.1f} / {row.backward_ms:5.2f} "
              f"{t.combined_ms:5.1f} / {row.combined_ms:5.2f} "
              f"{100 * overhead(t.combined_ms, base_published):+5.0f}% / "
              f"{100 * overhead(row.combined_ms, base_predicted):+5.1f}% "
              f"{100 * row.error:+6.1f}%")


if __name__ == "__main__":
    main()
