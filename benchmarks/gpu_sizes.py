"""Layer time by model size, and burst against sustained speed, measured on H200s and H100s
(issue 23).

    python3 benchmarks/gpu_sizes.py

Reads the raw files of ``validation/layer_sizes.py`` and ``validation/clocks.py`` under
topologies/measurements/own/ and prints, per GPU, the first, second and fourth of these
tables, then the fifth and the third (docs/profiles.md, "Layer time by size, measured", shows
them; a test fails when stale):

1. **Layers by size**: one tensor-parallel rank's share of the layers the development set
   trains, forward and backward (CUDA events, back to back: the card at its power limit):
   the GPU time with its range over rounds and machines, the host's time to issue the passes
   over the GPU's, and the engine's cost of the same shard (the GPU's ``-measured`` profile at
   sustained fraction 1: its kernels alone, then with the host floor), signed, positive is
   slower. Then each kernel family's share of the kernel time (the profiler's, one extra
   iteration) beside the engine's share: GEMMs, attention, the rest (norms, GELU, adds,
   copies: PyTorch eager runs them unfused, Megatron-LM fused, so that column is the layer's,
   not Megatron's).
2. **Kept for backward**: the bytes each shard's forward leaves allocated for its backward,
   beside the engine's activation tensors for the same layer (``activations.layer_tensors``).
3. **Autocast**: the same for the harness's GPT shapes under bf16 autocast over fp32
   parameters (``validation/autocast_memory.py``, H200 only) and what its loss keeps, beside
   the engine's autocast terms (``training.autocast``).
4. **Burst against sustained**: each workload timed in single calls after half a second idle
   and back to back for four seconds, with the SM clock and power ``nvidia-smi`` sampled
   meanwhile.
5. **H200 against H100**: each shard whose host runs ahead on both, the H200's time over the
   H100's for every pair of machines, beside the same ratio of the shipped (derived ``h200``
   and ``h100-sxm``) profiles; and the 8192^3 GEMM in each GPU's kernel sweeps and back to
   back, which shows how much machines of one kind differ.
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from pathlib import Path

from gpu_agreement import RUNS as KERNEL_SWEEPS
from gpu_layers import GPUS, predicted_layer, read_runs, shard_passes

from clustersim.simulator.inputs.specs import ModelSpec
from clustersim.simulator.model.activations import head_bytes, layer_tensors

ROOT = Path(__file__).resolve().parents[1]
OWN = ROOT / "topologies" / "measurements" / "own"
AUTOCAST = OWN / "2026-11-27-h200-autocast" / "autocast.csv"
FAMILIES = ("gemm", "attention", "other")


def rows(gpu: str = "h200") -> list[dict]:
    """Every run's ``sizes.csv`` rows of ``gpu``, each with its GPU and run number."""
    return read_runs(gpu, GPUS[gpu].sizes, "sizes.csv")


def steps(data: list[dict]) -> dict[str, list[dict]]:
    """Each shard's ``step`` rows (forward plus backward), one per round and machine, in the
    sweep's order (small to large)."""
    out: dict[str, list[dict]] = defaultdict(list)
    for r in data:
        if r["pass"] == "step":
            out[r["name"]].append(r)
    return out


def host_share(runs: list[dict]) -> float:
    """The host's time to issue a forward and backward over the GPU's (median)."""
    return statistics.median(float(r["host_s"]) / float(r["seconds"]) for r in runs)


def measured_shares(runs: list[dict]) -> dict[str, float]:
    """Each family's share of the profiler's kernel time (median over rounds)."""
    def share(r: dict, f: str) -> float:
        return float(r[f"{f}_s"]) / sum(float(r[f"{g}_s"]) for g in FAMILIES)
    return {f: statistics.median(share(r, f) for r in runs) for f in FAMILIES}


def engine_shares(r: dict) -> dict[str, float]:
    """Each family's share of the engine's kernel time for the same shard."""
    passes = shard_passes(r)
    times = {"gemm": sum(p.gemms for p in passes), "attention": sum(p.attention for p in passes),
             "other": sum(p.elementwise for p in passes)}
    return {f: t / sum(times.values()) for f, t in times.items()}


def engine_errors(data: list[dict], host: bool = True) -> dict[str, float]:
    """Each shard's engine time over the measured median, minus one."""
    return {name: predicted_layer(runs[0], host)
            / statistics.median(float(r["seconds"]) for r in runs) - 1
            for name, runs in steps(data).items()}


def layer_table(data: list[dict]) -> None:
    by_name, gpu = steps(data), GPUS[data[0]["gpu"]]
    print(f"{gpu.label} layers by size: one rank's share, forward + backward, bf16, sequence "
          f"2048; medians over {len(next(iter(by_name.values())))} rounds on "
          f"{len(gpu.sizes)} machines")
    print(f"{'layer':23s} {'mbs':>3s} {'GPU ms':>19s} {'host/GPU':>8s} {'kernels':>13s} "
          f"{'engine':>13s}   {'GEMM %':>9s} {'attention %':>11s} {'rest %':>9s}")
    kernels, engine = engine_errors(data, host=False), engine_errors(data)
    for name, runs in by_name.items():
        r = runs[0]
        gpu = [1e3 * float(x["seconds"]) for x in runs]
        median = statistics.median(gpu)
        got, want = measured_shares(runs), engine_shares(r)
        shares = " ".join(f"{100 * got[f]:5.0f}/{100 * want[f]:<{5 if f != 'attention' else 7}.0f}"
                          for f in FAMILIES)
        print(f"{name:23s} {r['batch']:>3s} {median:6.2f} ({min(gpu):5.2f}-{max(gpu):5.2f})"
              f" {host_share(runs):8.2f}"
              f" {median * (1 + kernels[name]):6.2f} {100 * kernels[name]:+4.0f}%"
              f" {median * (1 + engine[name]):6.2f} {100 * engine[name]:+4.0f}%   {shares}")
    ahead = [engine[n] for n, runs in by_name.items() if host_share(runs) < 0.6]
    print(f"shards whose host runs ahead (host/GPU < 0.6): {len(ahead)}, engine "
          f"{100 * min(ahead):+.0f}% to {100 * max(ahead):+.0f}%, median "
          f"{100 * statistics.median(ahead):+.1f}%  (shares: measured/engine)")


def shard_model(r: dict, vocab: int = 1024) -> ModelSpec:
    """One layer of a measured row's shape, without dropout (the measured layers have none)."""
    return ModelSpec(layers=1, hidden=int(r["hidden"]), heads=int(r["heads"]),
                     ffn_hidden=int(r["ffn"]), vocab=vocab, seq_len=int(r["seq"]), dropout=0.0)


def engine_saved_bytes(r: dict) -> float:
    """The bytes the engine's layer keeps for backward (``activations.layer_tensors``: no
    dropout, flash attention, as the measured shard runs), less the layer's input, which the
    sweep allocated before the forward it measures."""
    tp, batch, seq, hidden = int(r["tp"]), int(r["batch"]), int(r["seq"]), int(r["hidden"])
    kept = layer_tensors(shard_model(r), batch, tp, flash_attention=True, precision="bf16")
    return sum(kept.values()) - 2 * batch * seq * hidden


def memory_table(data: list[dict]) -> None:
    print("\nKept for backward: what a forward leaves allocated (torch.cuda.memory_allocated, "
          "less its output) against the engine's tensors")
    print(f"{'layer':23s} {'measured MiB':>12s} {'engine MiB':>10s} {'error':>7s}")
    for name, runs in steps(data).items():
        measured = statistics.median(int(r["saved_bytes"]) for r in runs)
        engine = engine_saved_bytes(runs[0])
        print(f"{name:23s} {measured / 2**20:12.1f} {engine / 2**20:10.1f} "
              f"{100 * (engine / measured - 1):+6.2f}%")


def autocast_engine(r: dict) -> tuple[float, float]:
    """The engine's autocast terms for a measured shape, as the sweep measured them: the
    layer's tensors less its fp32 input (allocated before), and the output layer and loss less
    the final norm's input (the sweep has no final norm) plus the output layer's bf16 weight
    (the engine counts it among the model states)."""
    tokens, hidden, vocab = int(r["batch"]) * int(r["seq"]), int(r["hidden"]), int(r["vocab"])
    model = shard_model(r, vocab)
    layer = sum(layer_tensors(model, int(r["batch"]), flash_attention=True, precision="bf16",
                              autocast=True).values()) - 4 * tokens * hidden
    loss = (head_bytes(model, tokens, 1, 1, "bf16", autocast=True) - 4 * tokens * hidden
            + 2 * vocab * hidden)
    return layer, loss


def autocast_table() -> None:
    """The harness's precision: one layer and the loss under bf16 autocast over fp32
    parameters, beside bf16 throughout and the engine's autocast terms."""
    print("\nAutocast over fp32 parameters (the harness's runs): what one layer and the loss "
          "keep for backward; layer columns in T x h bytes")
    print(f"{'shape':9s} {'tokens':>6s} {'layer bf16':>10s} {'autocast':>9s} "
          f"{'less casts':>10s} {'engine':>7s} {'loss MB':>8s} {'engine MB':>9s}")
    with AUTOCAST.open() as f:
        for r in csv.DictReader(f):
            tokens, hidden = int(r["batch"]) * int(r["seq"]), int(r["hidden"])
            units = tokens * hidden
            layer, loss = autocast_engine(r)
            autocast, casts = int(r["layer_autocast_bytes"]), int(r["weight_casts_bytes"])
            print(f"{r['name']:9s} {tokens:6d} {int(r['layer_bf16_bytes']) / units:10.2f} "
                  f"{autocast / units:9.2f} {(autocast - casts) / units:10.2f} "
                  f"{layer / units:7.2f} {int(r['loss_autocast_bytes']) / 1e6:8.0f} "
                  f"{loss / 1e6:9.0f}")


def clock_rows(gpu: str = "h200") -> dict[tuple[str, str], list[dict]]:
    """``gpu``'s clock rows by (workload, phase), every machine's rounds together."""
    out: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in read_runs(gpu, GPUS[gpu].clocks, "clocks.csv"):
        out[(r["workload"], r["phase"])].append(r)
    return out


def clock_table(gpu: str) -> None:
    data = clock_rows(gpu)
    rounds = len(data[next(iter(data))])
    machines = len(GPUS[gpu].clocks)
    print(f"\n{GPUS[gpu].label} burst against sustained: single calls after 0.5 s idle, and back "
          f"to back for 8 s (the last 4 kept); {rounds} rounds on {machines} "
          f"machine{'s' * (machines > 1)}")
    print(f"{'workload':24s} {'burst ms':>9s} {'sustained ms':>12s} {'slower':>7s} "
          f"{'SM MHz':>10s} {'sustained W':>11s}")
    for workload in dict.fromkeys(w for w, _ in data):
        burst, held = data[(workload, "burst")], data[(workload, "sustained")]

        def med(rs, key):
            return statistics.median(float(r[key]) for r in rs)
        b, s = 1e3 * med(burst, "seconds"), 1e3 * med(held, "seconds")
        print(f"{workload:24s} {b:9.3f} {s:12.3f} {100 * (s / b - 1):+6.1f}% "
              f"{med(burst, 'sm_mhz'):4.0f}/{med(held, 'sm_mhz'):<5.0f} "
              f"{med(held, 'power_w'):11.0f}")


PROFILES = ROOT / "topologies" / "profiles"
SHIPPED = {"h200": PROFILES / "h200.json", "h100-sxm": PROFILES / "h100-sxm.json"}
GEMM = ("gemm", "bf16", "8192", "8192", "8192", "forward")


def shipped_step(r: dict) -> float:
    """The engine's forward plus backward of a measured shard under the GPU's shipped
    profile, as a prediction runs it (sustained fraction and host floor included)."""
    forward, backward = shard_passes(r, SHIPPED[r["gpu"]])
    return forward.total + backward.total


def pair_ratios() -> dict[str, tuple[list[float], float]]:
    """Each shard whose host runs ahead on both GPUs: the H200's step time over the H100's for
    every pair of their machines (each machine's median), and the same ratio of the shipped
    profiles' predictions."""
    def by_machine(runs: list[dict]) -> list[float]:
        return [statistics.median(float(r["seconds"]) for r in runs if r["run"] == m)
                for m in sorted({r["run"] for r in runs})]
    h200, h100 = steps(rows("h200")), steps(rows("h100-sxm"))
    return {name: ([a / b for a in by_machine(h200[name]) for b in by_machine(h100[name])],
                   shipped_step(h200[name][0]) / shipped_step(h100[name][0]))
            for name in h200 if max(host_share(h200[name]), host_share(h100[name])) < 0.6}


def sweep_gemm_ms(gpu: str) -> list[float]:
    """The 8192^3 bf16 forward GEMM's median in each of the GPU's kernel sweeps (2026-11-25:
    short back-to-back timings, each shape in turn)."""
    out = []
    for folder in KERNEL_SWEEPS[gpu]:
        with (OWN / folder / "kernels.csv").open() as f:
            out += [1e3 * float(r["seconds"]) for r in csv.DictReader(f)
                    if (r["op"], r["dtype"], r["m"], r["n"], r["k"], r["pass"]) == GEMM][:1]
    return out


def pair_table() -> None:
    """The same work on both GPUs, machine against machine."""
    print("\nH200 against H100: the same shards (host ahead on both), H200 time over H100 time "
          "for every pair of machines, and the shipped profiles' ratio")
    print(f"{'layer':23s} {'measured':>13s} {'shipped':>8s}")
    for name, (measured, shipped) in pair_ratios().items():
        print(f"{name:23s} {min(measured):.3f}-{max(measured):.3f} {shipped:8.3f}")
    for gpu in GPUS:
        held = [float(r["seconds"]) * 1e3 for r in clock_rows(gpu)[("gemm 8192^3", "sustained")]]
        print(f"{GPUS[gpu].label} gemm 8192^3 ms: kernel sweeps "
              f"{', '.join(f'{t:.3f}' for t in sweep_gemm_ms(gpu))}; back to back "
              f"{min(held):.3f}-{max(held):.3f}")


if __name__ == "__main__":
    for n, gpu in enumerate(GPUS):
        print("\n" * (n > 0), end="")
        layer_table(rows(gpu))
        memory_table(rows(gpu))
        clock_table(gpu)
    pair_table()
    autocast_table()
