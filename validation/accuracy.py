"""The accuracy report: every comparison with published runs, held out first, fitted apart.

``collect`` predicts everything the project compares with published runs (``tests/data``):

- the development set (``published-dev.yaml``, ``devset.py``): 3D-parallel runs, per source;
- vTrain's single-node runs (``vtrain_single.py``), scored as the development set is but apart
  from it: small models on one node, where the host and small collectives decide;
- the published tables: each with the shipped profile of its GPU, and the two Megatron tables
  across GPUs (the A100 profile on the H100 table and the reverse, ``CROSS_GPU``);

and splits each by the one rule "a comparison with a profile fitted on that source is fitting,
not validation": a table named in the predicting profile's ``fitted_on``, or a development-set
source named there (by its group, or the whole file as ``published-dev``), moves to the fitted
section by itself. ``summary`` and ``details`` format the report (plain text or Markdown);
``README_BLOCK`` and ``DOCS_BLOCK`` name the README's and docs/accuracy.md's generated blocks,
which ``benchmarks/accuracy.py --write-readme`` rewrites and tests/validation/test_accuracy.py
checks.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from clustersim.simulator.pipeline.interleaved import INTERLEAVED_ORDER
from clustersim.topologies.profile import Profile, profile_for_gpu

from . import devset, vtrain_single
from . import published as pub

DEVSET_FILE = "published-dev.yaml"
# Published tables predicted with the shipped profile of their GPU; besides these, every
# heldout-*.yaml. (nccl-tests.yaml in the same folder is collectives, not training runs.)
TABLES = ("megatron2021", "megatron-core-h100")
# Each Megatron table predicted with the other GPU's profile: a test of transfer across GPUs.
CROSS_GPU = {"megatron2021": "h100-sxm", "megatron-core-h100": "a100-80gb"}
README_BLOCK = "accuracy"
DOCS_BLOCK = "accuracy-rows"
WORST_DEV_RUNS = 15  # how many of the development set's worst runs the docs list


@dataclass(frozen=True, slots=True)
class Comparison:
    """One published table predicted with one choice of profile."""

    title: str  # e.g. "megatron2021 on a100-80gb, h100-sxm profile (another GPU's)"
    rows: tuple[pub.Row, ...]


@dataclass(frozen=True, slots=True)
class AccuracyReport:
    """Every comparison, held out and fitted apart, at one fidelity."""

    fidelity: str
    held_out: tuple[Comparison, ...]
    fitted: tuple[Comparison, ...]
    dev_held_out: tuple[devset.DevResult, ...]
    dev_fitted: tuple[devset.DevResult, ...]
    single_node: tuple[devset.DevResult, ...] = ()  # vTrain's single-node runs, held out

    @property
    def held_out_rows(self) -> list[pub.Row]:
        return [row for comparison in self.held_out for row in comparison.rows]


def predictor(fidelity: str) -> pub.Predict:
    """Predict a scenario with a profile at ``fidelity`` (analytic, representative or full)."""
    if fidelity == "analytic":
        from clustersim.simulator.closed_form.analytic import estimate
        return lambda s, profile: estimate(s, profile)
    from clustersim.simulator.discrete_event.engine import simulate
    return lambda s, profile: simulate(s, fidelity, profile)


def collect(data: Path, fidelity: str = "representative") -> AccuracyReport:
    """Predict every published comparison under ``data`` and split held out from fitted."""
    predict = predictor(fidelity)
    held: list[Comparison] = []
    fitted: list[Comparison] = []
    for table, gpu in CROSS_GPU.items():
        _compare(pub.load_table(data / f"{table}.yaml"), " (another GPU's)",
                 profile_for_gpu(gpu), predict, held, fitted)
    for path in [*(data / f"{t}.yaml" for t in TABLES), *sorted(data.glob("heldout-*.yaml"))]:
        _compare(pub.load_table(path), "", None, predict, held, fitted)
    dev_held, dev_fitted = split_dev(devset.predict_runs(devset.load_runs(data / DEVSET_FILE),
                                                         predict))
    single, single_fitted = split_dev(devset.predict_runs(
        vtrain_single.load_runs(data / vtrain_single.FILE), predict))
    return AccuracyReport(fidelity, tuple(held), tuple(fitted), tuple(dev_held),
                          tuple(dev_fitted + single_fitted), tuple(single))


def _compare(cases: list[pub.PublishedCase], how: str, profile: Profile | None,
             predict: pub.Predict, held: list[Comparison], fitted: list[Comparison]) -> None:
    """Append the held-out and the fitted part of one table's comparison (either may be empty)."""
    held_cases, fitted_cases = pub.split_fitted(cases, profile)
    if held_cases:
        rows = pub.held_out_rows(held_cases, profile, predict)
        held.append(Comparison(_title(rows, how), tuple(rows)))
    if fitted_cases:
        rows = pub.predict_rows(fitted_cases, profile, predict)
        fitted.append(Comparison(_title(rows, how), tuple(rows)))


def _title(rows: list[pub.Row], how: str) -> str:
    gpus = ", ".join(sorted({row.case.scenario.cluster.gpu.id for row in rows}))
    profiles = ", ".join(sorted({row.profile for row in rows}))
    return f"{rows[0].case.table} on {gpus}, {profiles} profile{how}"


def split_dev(results: list[devset.DevResult]
              ) -> tuple[list[devset.DevResult], list[devset.DevResult]]:
    """(held out, fitted): a source any of whose runs' profile was fitted on it is fitted."""
    fitted_sources = {r.run.source for r in results if r.fitted}
    return ([r for r in results if r.run.source not in fitted_sources],
            [r for r in results if r.run.source in fitted_sources])


# ----------------------------------------------------------------------------------- rendering

class Table(NamedTuple):
    """Cells of a table; its first ``text_columns`` are text (left), the others numbers."""

    header: list[str]
    rows: list[list[str]]
    text_columns: int = 1


def _pct(x: float, signed: bool = False) -> str:
    return f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%"


def format_table(table: Table, markdown: bool) -> str:
    """A Markdown pipe table, or plain text with aligned columns (numbers to the right)."""
    header, rows, text = table
    if markdown:
        rule = ["---" if i < text else "---:" for i in range(len(header))]
        return "\n".join("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |"
                         for row in [header, rule, *rows])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) if i < text else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()
                     for row in [header, *rows])


ERROR_COLUMNS = ["runs", "mean |error|", "signed mean", "worst"]


def _error_cells(errors: list[float]) -> list[str]:
    return [str(len(errors)), _pct(statistics.fmean(map(abs, errors))),
            _pct(statistics.fmean(errors), signed=True), _pct(max(map(abs, errors)))]


def dev_table(score: devset.DevScore, title: str) -> Table:
    """Per source, then all runs: mean |error|, signed mean and worst of the iteration time."""
    rows = [[s.source, str(s.runs), _pct(s.mean_abs), _pct(s.signed, True), _pct(s.worst)]
            for s in score.sources]
    rows.append(["all runs", *_error_cells(list(score.errors))])
    return Table([title, *ERROR_COLUMNS], rows)


def comparisons_table(comparisons: tuple[Comparison, ...], title: str, total: bool) -> Table:
    """Per comparison (then, with ``total``, all rows): mean |error|, signed mean and worst."""
    rows = [[c.title, *_error_cells([r.error for r in c.rows])] for c in comparisons]
    if total and len(comparisons) > 1:
        rows.append(["all rows", *_error_cells([r.error for c in comparisons for r in c.rows])])
    return Table([title, *ERROR_COLUMNS], rows)


def dev_lines(score: devset.DevScore) -> list[str]:
    """The development set's headline, memory and ranking in sentences."""
    mean_of_sources = statistics.fmean(s.mean_abs for s in score.sources)
    lines = [f"{len(score.errors)} timed runs from {len(score.sources)} sources: mean |error| "
             f"per source {_pct(mean_of_sources)} on average."]
    if score.memory_total:
        lines.append(f"Fit/OOM outcomes: {score.memory_agree}/{score.memory_total} agree with "
                     f"the published ones.")
    rank = score.ranking
    if rank.pairs:
        lines.append(f"Ranking within jobs (same model, cluster and batch): "
                     f"{rank.right}/{rank.pairs} pairs in the measured order "
                     f"({_pct(rank.right / rank.pairs)}); the run predicted fastest was measured "
                     f"{_pct(statistics.fmean(rank.regrets))} slower than the fastest on average "
                     f"over {len(rank.regrets)} jobs, {_pct(max(rank.regrets))} at worst.")
    return lines


SIGN_NOTE = ("Signed errors: the development set's are on iteration time (below zero: "
             "predicted too fast); the tables' on throughput or MFU (above zero: predicted too "
             "fast).")


def summary(report: AccuracyReport, markdown: bool) -> str:
    """Held-out development set and tables (the headline), then the fitted ones apart."""
    engine = ("closed-form estimate" if report.fidelity == "analytic"
              else f"engine, {report.fidelity}")
    bold = "**" if markdown else ""
    parts = []
    if report.dev_held_out:
        score = devset.score(report.dev_held_out)
        parts += [f"{bold}Held out: development set ({DEVSET_FILE}, {engine}).{bold} "
                  + " ".join(dev_lines(score)),
                  format_table(dev_table(score, "source (held out)"), markdown)]
    if report.single_node:
        parts.append(single_node_line(report.single_node, engine, bold))
    if report.held_out:
        mean, worst = pub.summary(report.held_out_rows)
        parts += [f"{bold}Held out: published tables ({engine}).{bold} "
                  f"{len(report.held_out_rows)} runs: mean |error| {_pct(mean)}, worst "
                  f"{_pct(worst)}.",
                  format_table(comparisons_table(report.held_out, "table (held out)", True),
                               markdown)]
    parts.append(SIGN_NOTE)
    parts += _fitted_summary(report, engine, markdown)
    return "\n\n".join(parts) + "\n"


def single_node_line(results: tuple[devset.DevResult, ...], engine: str, bold: str) -> str:
    """vTrain's single-node runs in one paragraph: errors and, where jobs have them, ranking."""
    score = devset.score(results)
    (source,), rank = score.sources, score.ranking
    line = (f"{bold}Held out: vTrain's single-node runs ({vtrain_single.FILE}, {engine}).{bold} "
            f"{source.runs} timed runs of GPT models of hidden size 1,024 and 2,048 on 2-8 A100s "
            f"of one node, every split: mean |error| {_pct(source.mean_abs)}, signed mean "
            f"{_pct(source.signed, True)}, worst {_pct(source.worst)}")
    if not rank.pairs:
        return line + "."
    return (f"{line}; {rank.right}/{rank.pairs} pairs in the measured order "
            f"({_pct(rank.right / rank.pairs)}), the run predicted fastest measured "
            f"{_pct(statistics.fmean(rank.regrets))} slower than the fastest on average over "
            f"{len(rank.regrets)} jobs, {_pct(max(rank.regrets))} at worst.")


def _fitted_summary(report: AccuracyReport, engine: str, markdown: bool) -> list[str]:
    bold = "**" if markdown else ""
    parts = [f"{bold}Fitted, apart ({engine}):{bold} comparisons with the runs a profile was "
             f"fitted on say how well the fit went, nothing about predictions."]
    if report.fitted:
        parts.append(format_table(comparisons_table(report.fitted, "table (fitted)", False),
                                  markdown))
    if report.dev_fitted:
        parts.append(format_table(dev_table(devset.score(report.dev_fitted), "source (fitted)"),
                                  markdown))
    return parts


def rows_table(rows: tuple[pub.Row, ...]) -> Table:
    """Every row of one comparison: the case, its metric, the unpublished settings it was
    compared with (the fastest candidate that fits), predicted, published, error."""
    body = []
    for row in rows:
        scale = 100 if row.case.metric in ("mfu", "hfu") else 1
        body.append([row.case.id, row.case.metric, _as_run(row),
                     f"{row.predicted * scale:.1f}", f"{row.case.published * scale:.1f}",
                     _pct(row.error, True)])
    return Table(["case", "metric", "as run", "predicted", "published", "error"], body,
                 text_columns=3)


def _as_run(row: pub.Row) -> str:
    """The schedule and recomputation of the candidate compared, and its micro-batch where
    that was a candidate too, where the source left them out (``unpublished.py``); "" where it
    published them."""
    if len(row.case.options) == 1 or row.scenario is None:
        return ""
    p = row.scenario.parallel
    schedule = (f"{p.schedule}×{p.virtual_stages}" if p.schedule in INTERLEAVED_ORDER
                and p.virtual_stages > 1 else p.schedule)
    sizes = {s.training.micro_batch for s in row.case.options}
    size = f", mb {row.scenario.training.micro_batch}" if len(sizes) > 1 else ""
    return f"{schedule}, recompute {p.recompute}{size}"


def worst_dev_table(results: tuple[devset.DevResult, ...], count: int) -> Table:
    """The ``count`` timed runs with the largest |error|."""
    timed = sorted((r for r in results if r.error is not None), key=lambda r: -abs(r.error))
    return Table(["run", "published (s)", "predicted (s)", "error"],
                 [[r.run.id, f"{r.run.published_s:.3f}", f"{r.predicted_s:.3f}",
                   _pct(r.error, True)] for r in timed[:count]])


# The splits' dimensions a bias table groups the development set by, and where each group
# starts: where the model leans one way, a planner's ranking of such splits leans with it.
BIAS_DIMENSIONS = {"pipeline stages": ("parallel", "pp", (1, 2, 8, 32)),
                   "tensor-parallel size": ("parallel", "tp", (1, 2, 4, 8, 16)),
                   "micro-batch": ("training", "micro_batch", (1, 2, 4, 8))}
DEV_BIAS = ("pipeline stages", "tensor-parallel size")
SINGLE_NODE_BIAS = ("tensor-parallel size", "micro-batch")


def bias_table(results: tuple[devset.DevResult, ...], dimension: str) -> Table:
    """The timed runs' errors grouped by one dimension of their split (``BIAS_DIMENSIONS``),
    each group named by the values it holds: a signed mean far from zero in one group is a
    bias the per-source means can hide."""
    section, field, starts = BIAS_DIMENSIONS[dimension]
    groups: dict[int, list[tuple[int, float]]] = {}
    for r in results:
        if r.error is not None:
            value = r.run.candidates[0][section][field]
            group = max(start for start in starts if start <= value)
            groups.setdefault(group, []).append((value, r.error))
    rows = []
    for _, runs in sorted(groups.items()):
        low, high = min(v for v, _ in runs), max(v for v, _ in runs)
        rows.append([str(low) if low == high else f"{low}-{high}",
                     *_error_cells([e for _, e in runs])])
    return Table([dimension, *ERROR_COLUMNS], rows)


def details(report: AccuracyReport, markdown: bool, worst: int = WORST_DEV_RUNS) -> str:
    """Every table row, held out then fitted, the development set's bias by split and its
    worst runs."""
    bold = "**" if markdown else ""
    parts = []
    for label, comparisons in (("Held out", report.held_out), ("Fitted", report.fitted)):
        for comparison in comparisons:
            parts += [f"{bold}{label}: {comparison.title}{bold}",
                      format_table(rows_table(comparison.rows), markdown)]
    for title, results, dimensions in (
            ("Development set (held out)", report.dev_held_out, DEV_BIAS),
            ("vTrain's single-node runs (held out)", report.single_node, SINGLE_NODE_BIAS)):
        for dimension in dimensions if results else ():
            parts += [f"{bold}{title} by {dimension}{bold}",
                      format_table(bias_table(results, dimension), markdown)]
    for label, results in (("Development set (held out)", report.dev_held_out),
                           ("Development set (fitted)", report.dev_fitted),
                           ("vTrain's single-node runs (held out)", report.single_node)):
        if results and worst:
            parts += [f"{bold}{label}: the {worst} runs with the largest error{bold}",
                      format_table(worst_dev_table(results, worst), markdown)]
    return "\n\n".join(parts) + "\n"


# ------------------------------------------------------------------------- generated blocks


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def generated(report: AccuracyReport) -> dict[str, str]:
    """The body of each generated Markdown block, by block name."""
    note = ("<!-- Generated by `python3 benchmarks/accuracy.py --write-readme`; do not edit by "
            "hand (tests/validation/test_accuracy.py fails when it is stale). -->\n\n")
    return {README_BLOCK: note + summary(report, markdown=True),
            DOCS_BLOCK: note + details(report, markdown=True)}


def read_block(text: str, name: str) -> str | None:
    """What lies between a block's markers (None where the markers are missing)."""
    begin, end = markers(name)
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        return None
    return text[start + len(begin):stop].strip("\n") + "\n"


def replace_block(text: str, name: str, body: str) -> str:
    """``text`` with a block's content replaced by ``body``; ValueError if it has no markers."""
    begin, end = markers(name)
    if read_block(text, name) is None:
        raise ValueError(f"no {begin} ... {end} markers")
    start, stop = text.find(begin) + len(begin), text.find(end)
    return f"{text[:start]}\n{body}{text[stop:]}"


def block_files(root: Path) -> dict[str, Path]:
    """The file that holds each generated block, under the repository's root."""
    return {README_BLOCK: root / "README.md", DOCS_BLOCK: root / "docs" / "accuracy.md"}


def stale_files(report: AccuracyReport, root: Path) -> list[Path]:
    """The files whose generated block differs from what ``report`` renders now."""
    bodies = generated(report)
    return [path for name, path in block_files(root).items()
            if read_block(path.read_text(encoding="utf-8"), name) != bodies[name]]


def write_blocks(report: AccuracyReport, root: Path) -> list[Path]:
    """Rewrite each stale generated block from ``report``; the files that changed."""
    bodies, changed = generated(report), []
    for name, path in block_files(root).items():
        text = path.read_text(encoding="utf-8")
        if read_block(text, name) != bodies[name]:
            path.write_text(replace_block(text, name, bodies[name]), encoding="utf-8")
            changed.append(path)
    return changed
