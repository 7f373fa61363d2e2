"""What the command-line fuzz feeds ``clustersim`` (issue 24, item 9): hypothesis strategies
for the argument lists of ``simulate``, ``plan``, ``sweep``, ``report``, ``collective`` and
``validate --dry-run``, mixing the shipped examples and presets with mutations.

Every case runs in a fresh working folder that holds the files of ``write_fixtures`` (a
non-UTF-8 scenario, an empty one, a folder where a file is expected, a small sweep table, ...);
argument lists name them by relative path, and outputs go there too. Each case is kept fast
(about 2 s at most): small models and few GPUs, ``plan`` with tp and pp pinned, ``sweep`` with
``--jobs 1`` and a grid of at most 3 x 3 points, no full fidelity on large clusters, and
``validate`` always with ``--dry-run`` so that nothing is ever trained. docs/fuzzing.md.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(str(p) for p in (ROOT / "examples").glob("*.yaml"))
# Engine runs of these take over 1 s each (measured on a 2-core machine): analytic only.
SLOW_EXAMPLES = ("gpt3-175b-fp8", "llama3-70b-fp8", "llama3-405b", "deepseek-v3")
SMALL_MODELS = ("gpt-1.7b", "gpt-3.6b", "llama2-7b", "llama3-8b", "llama3.1-8b",
                "mixtral-8x7b", "deepseek-moe-16b", "deepseek-v2-lite")
PROFILES = ("h100-sxm", "a100-80gb", "cpu-core", "no-such-profile")
OUTPUTS = ("out", "out.csv", "out.json", "out.png", "out.svg", "out.parquet", "out.csv.gz",
           "out.txt", "sub/out.csv", "missing-folder/x/out.csv", "folder", "", ".")

# A small sweep table (two rows), as `sweep --out` writes one, for `report`.
_SWEEP_ARGS = ["sweep", "{good}", "--grid", "parallel.tp=1,2", "--jobs", "1",
               "--fidelity", "analytic"]


def presets() -> dict[str, list[str]]:
    """Preset names by kind, as ``clustersim presets --json`` lists them."""
    from clustersim.reports.tables import preset_rows

    return {kind: [row["name"] for row in rows] for kind, rows in preset_rows().items()}


def known_fields() -> list[str]:
    """Every ``section.field`` of the scenario format, read from docs/scenario.md (generated
    from the specs, and checked fresh by a test)."""
    fields, section = [], None
    for line in (ROOT / "docs" / "scenario.md").read_text().splitlines():
        heading = re.match(r"## `([\w.]+)`", line)
        if heading:
            section = heading.group(1)
        row = re.match(r"\| `(\w+)` \|", line)
        if row and section:
            fields.append(f"{section}.{row.group(1)}")
    return fields


PRESETS = presets()
FIELDS = known_fields()
UNKNOWN_FIELDS = ("model.layerz", "training.global_bacth", "parallel", "parallel.tp.x", "x",
                  "", ".", "model..layers", "cluster.gpu.peak_flops.bf16", "parallel.dp ",
                  "training.tokens\udce9", "__class__", "model.preset.name")

GOOD_SCENARIO = """\
model: {preset: gpt-1.7b}
cluster: {preset: dgx-a100-80gb, gpus: 8}
training: {global_batch: 64, micro_batch: 1, tokens: 3.0e11}
parallel: {tp: 1, pp: 1, dp: 8}
"""


def write_fixtures(folder: Path, tables: dict[str, str]) -> None:
    """The input files every case may name, written fresh into its working folder."""
    for name, text in tables.items():
        (folder / name).write_text(text)
    table_csv = tables["table.csv"]
    (folder / "good.yaml").write_text(GOOD_SCENARIO)
    (folder / "latin1.yaml").write_bytes(GOOD_SCENARIO.encode() + b"# caf\xe9\n")
    (folder / "empty.yaml").write_text("")
    (folder / "garbage.yaml").write_text("model: [unclosed\n\t: - {")
    (folder / "list.yaml").write_text("- 1\n- 2\n")
    (folder / "dir.yaml").mkdir()
    (folder / "sub").mkdir()
    (folder / "empty.csv").write_text("")
    (folder / "header.csv").write_text(table_csv.splitlines()[0] + "\n")
    (folder / "junk.csv").write_text("a,b\n1,2\nx,\"unclosed\n")
    (folder / "latin1.csv").write_bytes(table_csv.encode() + b"caf\xe9\n")
    (folder / "junk.parquet").write_bytes(b"PAR1 not really")
    (folder / "profile.json").write_text('{"name": "x"}')
    (folder / "latin1.json").write_bytes(b'{"name": "caf\xe9"}')


INPUT_FILES = ("good.yaml", "latin1.yaml", "empty.yaml", "garbage.yaml", "list.yaml",
               "dir.yaml", "missing.yaml", "table.csv")
TABLES = ("table.csv", "empty.csv", "header.csv", "junk.csv", "latin1.csv", "junk.parquet",
          "missing.csv", "good.yaml", "dir.yaml", "failed.csv", "noresult.csv")

NUMBERS = st.one_of(
    st.integers(-3, 70), st.sampled_from([0, 1, 2, 8, 10**6, 2**63, 10**30, -(2**31)]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.5, 1e-300, 1.0])
).map(str)
STRANGE = st.sampled_from(["", "nan", "inf", "-inf", "1e400", "-0", "true", "null", "~",
                           "[1, 2]", "{a: 1}", "0x10", "1_000", "8G", "1,2", "'", "\"",
                           "caf\udce9", "\udcff\udcfe", " ", "a=b", "--json", "-1", "1.5"])
TEXT = st.text(max_size=8)
VALUES = st.one_of(NUMBERS, STRANGE, TEXT)
# What a field's values mostly look like, so that many cases get past the first check.
PLAUSIBLE = {"parallel.tp": [1, 2, 4, 8], "parallel.pp": [1, 2, 4], "parallel.zero": [0, 1, 3],
             "parallel.schedule": ["1f1b", "interleaved", "zb-h1", "gpipe", "dualpipev"],
             "parallel.recompute": ["none", "selective", "full"],
             "training.micro_batch": [1, 2], "training.precision": ["bf16", "fp8", "fp16"],
             "training.global_batch": [8, 64, 512], "cluster.gpus": [8, 16, 64],
             "parallel.layer_split": ["even", "ends_as_layers"],
             "training.framework": ["megatron", "deepspeed", "fsdp"],
             "parallel.dp_shard": [1, 2, 4, 8]}


def choose(draw, rate: int, good, bad):
    """A draw from ``good``, or from ``bad`` with probability ``rate`` percent: each case has
    one mutation rate, so that some cases are wholly valid and get past the first check."""
    return draw(bad if draw(st.integers(0, 99)) < rate else good)


RATES = st.sampled_from([0, 0, 5, 15, 40])  # percent of a case's choices that are mutated


@st.composite
def assignment(draw, rate: int) -> str:
    """A ``PATH=VALUE`` for --set or --fix: a plausible field and value, or a mutation (any
    known or unknown field, a strange value, no '=' at all)."""
    field = choose(draw, rate, st.sampled_from(sorted(PLAUSIBLE)),
                   st.one_of(st.sampled_from(FIELDS), st.sampled_from(UNKNOWN_FIELDS)))
    good = st.sampled_from(PLAUSIBLE[field]).map(str) if field in PLAUSIBLE else VALUES
    value = choose(draw, rate, good, VALUES)
    return choose(draw, rate, st.just(f"{field}={value}"),
                  st.sampled_from([field, f"={value}", f"{field}={value}"]))


def scenario_arg(draw, rate: int, fast_only: bool) -> str:
    """A scenario path: a shipped example (absolute) or a broken fixture (relative)."""
    examples = [e for e in EXAMPLES if not (fast_only and any(s in e for s in SLOW_EXAMPLES))]
    return choose(draw, rate, st.sampled_from(examples + ["good.yaml"]),
                  st.sampled_from(INPUT_FILES))


def repeat(draw, flag: str, values, max_size: int = 2) -> list[str]:
    """``flag value`` pairs, 0 to max_size of them, flattened."""
    return [x for v in draw(st.lists(values, max_size=max_size)) for x in (flag, v)]


def option(draw, rate: int, flag: str, good: list, bad: list | None = None) -> list[str]:
    """``[flag, value]`` (a good value, or a bad one at the case's rate) or nothing."""
    if not draw(st.booleans()):
        return []
    bad_values = st.sampled_from(bad) if bad else NUMBERS
    return [flag, str(choose(draw, rate, st.sampled_from(good), bad_values))]


def switch(draw, flag: str) -> list[str]:
    return draw(st.sampled_from([[], [flag]]))


BAD_FLAGS = st.sampled_from([["--no-such-flag"], ["-x"], ["--json=1"], ["--"], ["--help"],
                             ["--set"], ["extra-positional"], ["--fidelity"]])


def bad_flag(draw, rate: int) -> list[str]:
    return choose(draw, rate, st.just([]), BAD_FLAGS)


@st.composite
def simulate_argv(draw) -> list[str]:
    rate = draw(RATES)
    fidelity = choose(draw, rate, st.sampled_from(["analytic", "representative", "full"]),
                      st.just("bogus"))
    scenario = scenario_arg(draw, rate, fast_only=fidelity != "analytic")
    sets = repeat(draw, "--set", assignment(rate), 3)
    if fidelity == "full":  # full fidelity simulates every rank: only on the 8-GPU fixture
        scenario, sets = "good.yaml", [s for s in sets if "cluster" not in s]
    engine = fidelity != "analytic"
    argv = ["simulate", scenario, *sets, "--fidelity", fidelity, *switch(draw, "--json")]
    if engine or draw(st.integers(0, 99)) < rate:  # the analytic estimate has no trace
        argv += option(draw, rate, "--trace", ["trace.json", "sub/trace.json"], OUTPUTS)
    if engine and draw(st.integers(0, 5)) == 0:  # a timeline is drawn by matplotlib: ~0.3 s
        argv += option(draw, rate, "--timeline", ["t.png", "sub/t.svg"], OUTPUTS)
    argv += option(draw, rate, "--profile", ["h100-sxm", "a100-80gb"],
                   ["cpu-core", "no-such", "profile.json", "latin1.json", "missing.json"])
    argv += switch(draw, "--force-profile")
    argv += option(draw, rate, "--samples", [2, 3], [-1, 0, 1, "x"])  # 10**9: hours, asked
    argv += option(draw, rate, "--seed", [0, 7], [-1, 2**70, "s"])
    return argv + bad_flag(draw, rate)


@st.composite
def plan_argv(draw) -> list[str]:
    rate = draw(RATES)
    model = choose(draw, rate, st.sampled_from(SMALL_MODELS + (
        "good.yaml", str(ROOT / "examples" / "qwen2-7b-hf-h100.yaml"))), st.sampled_from(
        ["latin1.yaml", "garbage.yaml", "missing.yaml", "empty.yaml", "no-such-model"]))
    cluster = choose(draw, rate, st.sampled_from(PRESETS["clusters"] + ["good.yaml"]),
                     st.sampled_from(["empty.yaml", "missing.yaml", "no-such", "dir.yaml"]))
    gpus = choose(draw, rate, st.sampled_from(["1", "2", "4", "8", "16"]),
                  st.sampled_from(["0", "-8", "3", "x", "1e3", "100000"]))
    # tp, pp, ZeRO, schedule and micro-batch pinned keep the search to a few splits (an
    # open search takes 5-40 s; with only tp, pp and ZeRO pinned, up to 12 s)
    pins = ["--fix", f"parallel.tp={draw(st.sampled_from([1, 2, 4, 8]))}",
            "--fix", f"parallel.pp={draw(st.sampled_from([1, 2]))}",
            "--fix", f"parallel.zero={draw(st.sampled_from([0, 1]))}",
            "--fix", "parallel.schedule=1f1b", "--fix", "parallel.recompute=none",
            "--fix", f"training.micro_batch={draw(st.sampled_from([1, 2]))}"]
    argv = ["plan", "--model", model, "--cluster", cluster, "--gpus", gpus, *pins,
            *repeat(draw, "--fix", assignment(rate), 2)]
    argv += option(draw, rate, "--tokens", ["1e9", "15e12"])
    argv += option(draw, rate, "--global-batch", ["8", "64", "256"], ["0", "-1", "x", "1e18"])
    argv += option(draw, rate, "--seq-len", ["512", "4096"], ["0", "nan", "-1", "10000000"])
    argv += option(draw, rate, "--top", ["1", "3"], ["0", "-1"])
    argv += option(draw, rate, "--framework", ["megatron", "deepspeed", "fsdp"],
                   ["torchtitan", "", "FSDP"])
    argv += option(draw, rate, "--memory-reserve", ["0.05", "0.2"])
    argv += option(draw, rate, "--mtbf-hours", ["50000"])
    argv += option(draw, rate, "--checkpoint-write-s", ["60"])
    argv += option(draw, rate, "--checkpoint-restore-s", ["300"])
    argv += option(draw, rate, "--gpu-hour-price", ["2.5"])
    argv += option(draw, rate, "--save-best", ["best.yaml", "sub/best.yaml"], OUTPUTS)
    argv += option(draw, rate, "--samples", ["2"], ["0", "-1", "x"])
    if draw(st.integers(0, 5)) == 0:
        argv += option(draw, rate, "--plots", ["plots"], OUTPUTS)
    return argv + switch(draw, "--json") + bad_flag(draw, rate)


@st.composite
def grid(draw, rate: int) -> str:
    """A --grid of 1 to 3 values: a plausible swept field, or a mutated one."""
    field = choose(draw, rate, st.sampled_from(sorted(PLAUSIBLE)),
                   st.one_of(st.sampled_from(FIELDS), st.sampled_from(UNKNOWN_FIELDS)))
    good = st.sampled_from(PLAUSIBLE[field]).map(str) if field in PLAUSIBLE else VALUES
    values = [choose(draw, rate, good, VALUES) for _ in range(draw(st.integers(1, 3)))]
    return choose(draw, rate, st.just(f"{field}={','.join(values)}"),
                  st.sampled_from([field, f"{field}=", f"={values[0]}"]))


@st.composite
def sweep_argv(draw) -> list[str]:
    rate = draw(RATES)
    grids = draw(st.lists(grid(rate), min_size=1, max_size=2))
    argv = ["sweep", scenario_arg(draw, rate, fast_only=True),
            *[x for g in grids for x in ("--grid", g)], *repeat(draw, "--set", assignment(rate)),
            "--jobs", choose(draw, rate, st.just("1"), st.sampled_from(["0", "-2", "x"])),
            "--fidelity", choose(draw, rate, st.sampled_from(["analytic", "representative"]),
                                 st.just("x"))]
    argv += option(draw, rate, "--out", ["s.csv", "s.csv.gz", "s.parquet", "table.csv"],
                   OUTPUTS)
    argv += switch(draw, "--fresh")
    if draw(st.integers(0, 5)) == 0:  # plots take about 2 s
        argv += option(draw, rate, "--plots", ["plots"], OUTPUTS)
    argv += option(draw, rate, "--top", ["1", "5"], ["0", "-3", "x"])
    argv += option(draw, rate, "--samples", ["2"], ["0", "-1"])
    argv += option(draw, rate, "--profile", ["h100-sxm"], list(PROFILES))
    return argv + bad_flag(draw, rate)


@st.composite
def report_argv(draw) -> list[str]:
    rate = draw(RATES)
    argv = ["report", choose(draw, rate, st.just("table.csv"), st.sampled_from(TABLES))]
    argv += option(draw, rate, "--out", ["rep", "sub/rep"], OUTPUTS)
    return argv + bad_flag(draw, rate)


SIZES = ["0", "-1", "1X", "1e400", "nan", "", "1.5M", "16T", "1M1", "1e3"]


@st.composite
def collective_argv(draw) -> list[str]:
    rate = draw(RATES)
    op = choose(draw, rate, st.sampled_from(["allreduce", "allgather", "reduce_scatter",
                                             "alltoall"]), st.just("broadcast"))
    cluster = choose(draw, rate, st.sampled_from(PRESETS["clusters"] + ["good.yaml"]),
                     st.sampled_from(INPUT_FILES))
    # alltoall on 64 GPUs up to 8G takes 5 s at full fidelity: 16 at most
    gpus = choose(draw, rate, st.sampled_from(["2", "8", "16"]),
                  st.sampled_from(["1", "3", "0", "-4", "x", "100000"]))
    argv = ["collective", op, "--cluster", cluster, "--gpus", gpus]
    argv += option(draw, rate, "--min-bytes", ["8", "64K", "1M"], SIZES)
    argv += option(draw, rate, "--max-bytes", ["1M", "1G", "8G"], SIZES)
    argv += option(draw, rate, "--factor", ["2", "4"], ["1", "0", "-2", "x"])
    if gpus == "100000":  # full fidelity moves every flow: over a minute (docs/fuzzing.md)
        return argv + ["--fidelity", "representative"]
    argv += option(draw, rate, "--fidelity", ["full", "representative"], ["analytic"])
    return argv + switch(draw, "--json") + bad_flag(draw, rate)


@st.composite
def validate_argv(draw) -> list[str]:
    rate = draw(RATES)
    scenario = choose(draw, rate, st.sampled_from(
        [str(ROOT / "examples" / "validate-gpt-60m.yaml"), "good.yaml"]),
        st.sampled_from(EXAMPLES + list(INPUT_FILES)))
    argv = ["validate", scenario, "--dry-run", *repeat(draw, "--set", assignment(rate))]
    argv += option(draw, rate, "--backend", ["gloo"], ["nccl", "mpi"])
    argv += option(draw, rate, "--nproc", ["1", "2"], ["3", "0", "-1", "x"])
    argv += option(draw, rate, "--steps", ["2", "6"], ["1", "0", "-5"])
    argv += option(draw, rate, "--profile", ["cpu-core"], list(PROFILES) + ["latin1.json"])
    argv += switch(draw, "--force-profile")
    argv += option(draw, rate, "--out", ["v", "sub/v"], OUTPUTS)
    return argv + switch(draw, "--json") + bad_flag(draw, rate)


COMMANDS = {"simulate": simulate_argv, "plan": plan_argv, "sweep": sweep_argv,
            "report": report_argv, "collective": collective_argv, "validate": validate_argv}
# Report draws plots (about 2 s a case); the others mostly run in well under a second.
WEIGHTS = {"simulate": 4, "plan": 2, "sweep": 2, "report": 1, "collective": 2, "validate": 2}


def argv_strategy():
    """One command's argument list, commands drawn by WEIGHTS."""
    names = [name for name, w in WEIGHTS.items() for _ in range(w)]
    return st.sampled_from(names).flatmap(lambda name: COMMANDS[name]())


def table_fixtures(folder: Path) -> dict[str, str]:
    """The sweep tables ``report`` cases read: a small one made once by the real ``sweep``
    (table.csv), the same with every point failed (failed.csv: no result columns, as
    ``sweep`` writes it then), and one whose rows ran but lost their results."""
    import pandas as pd

    good = _sweep_table(folder)
    df = pd.read_csv(io.StringIO(good))
    inputs = list(df.columns[:df.columns.get_loc("error") + 1])
    failed = df[inputs].assign(status="failed", error="ScenarioError: x: refused")
    return {"table.csv": good, "failed.csv": failed.to_csv(index=False),
            "noresult.csv": df[inputs].to_csv(index=False)}


def _sweep_table(folder: Path) -> str:
    """The small sweep table that ``report`` cases read, made once by the real ``sweep``."""
    from clustersim.cli import main

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "good.yaml").write_text(GOOD_SCENARIO)
    out = folder / "table.csv"
    argv = [a.format(good=folder / "good.yaml") for a in _SWEEP_ARGS] + ["--out", str(out)]
    with open(os.devnull, "w") as sink:
        import contextlib
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            assert main(argv) == 0, argv
    return out.read_text()
