"""What each training stack can run: the values of a split a planner may choose under
``training.framework``.

``frameworks.py`` says what a stack does with a field left out; this module says which values
the stack offers at all, read from its code, so that ``plan --fix training.framework=...``
searches only splits that stack can launch. Megatron-LM, the default, keeps every schedule
clustersim has: the planner has always searched them and says beside a plan which ones
Megatron-LM's main line does not run (``reports/megatron.py``); DeepSpeed and FSDP are held to
what they run, and to no feature whose cost clustersim models after another stack's
implementation (Transformer Engine's userbuffers for ``tp_comm_overlap``).
docs/frameworks.md prints ``markdown_table``; a test keeps the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import frameworks


@dataclass(frozen=True, slots=True)
class StackChoices:
    """The split values one stack runs (``None``: every one clustersim has), and where each
    was read."""

    schedules: tuple[str, ...] | None
    zero_stages: tuple[int, ...]  # without a pipeline
    pipelined_zero_stages: tuple[int, ...]  # with pp > 1
    tp_comm_overlap: bool
    schedules_without_sp: tuple[str, ...]  # schedules the stack refuses with sequence parallelism
    source: str  # Markdown
    hybrid_sharding: bool = False  # one sharded copy a node (dp_shard) searched beside plain ZeRO
    # interleaved micro-batches per pipeline walked in m // pp equal rounds (torch's
    # ScheduleInterleaved1F1B), so a count they do not divide does not run; else Megatron-LM's
    # groups (``interleaved.microbatch_group``), which take any count of at least pp
    interleaved_in_rounds: bool = False
    # how the context-parallel ranks may share K and V (``parallel.cp_comm``), searched when
    # cp > 1; the first is the stack's default (``frameworks.DEFAULTS``)
    cp_comms: tuple[str, ...] = ("p2p", "allgather", "a2a", "a2a+p2p")


CHOICES: dict[str, StackChoices] = {
    "megatron": StackChoices(
        schedules=None, zero_stages=(0, 1, 2, 3), pipelined_zero_stages=(0, 1, 3),
        tp_comm_overlap=True, schedules_without_sp=(),
        source=(
            "Megatron-LM runs 1F1B and, with `--num-virtual-stages-per-pipeline-rank`, the "
            "interleaved schedule (megatron/core/pipeline_parallel/schedules.py, "
            "`get_forward_backward_func`); the planner also searches the zero-bubble and "
            "DualPipe schedules and names the code that runs them beside a plan "
            "(reports/megatron.py). ZeRO-1 is `--use-distributed-optimizer`, ZeRO-2/3 Megatron-"
            "FSDP; `--tp-comm-overlap` is Transformer Engine's userbuffers; `--cp-comm-type` "
            "takes `p2p`, `allgather`, `a2a` and `a2a+p2p` (with "
            "`--hierarchical-context-parallel-sizes`)")),
    "deepspeed": StackChoices(
        schedules=("1f1b", "zb-h1"), zero_stages=(0, 1, 2, 3), pipelined_zero_stages=(0, 1),
        tp_comm_overlap=False, schedules_without_sp=("zb-h1",),
        source=(
            "DeepSpeed's `PipelineEngine` runs `TrainSchedule` (deepspeed/runtime/pipe/"
            "schedule.py), 1F1B without interleaving; Megatron-DeepSpeed's "
            "`--enable-zbh1-pipeline` swaps in `ZeroBubbleH1Pipeline` and asserts no sequence "
            "parallelism (megatron/initialize.py, megatron/arguments.py). The pipeline engine "
            "refuses ZeRO-2 and -3 (deepspeed/runtime/pipe/engine.py). Neither has a tensor-"
            "parallel communication overlap. Its context parallelism is Ulysses' all-to-alls "
            "(`--ds-sequence-parallel-size`, deepspeed/sequence/layer.py)"),
        cp_comms=("a2a",)),
    "fsdp": StackChoices(
        schedules=("gpipe", "1f1b", "interleaved", "zb-v", "dualpipev"),
        zero_stages=(0, 2, 3), pipelined_zero_stages=(0, 2),
        tp_comm_overlap=False, schedules_without_sp=(),
        source=(
            "torchtitan's `pipeline_parallel_schedule` names a torch.distributed.pipelining "
            "schedule (`get_schedule_class`, torch/distributed/pipelining/schedules.py): GPipe, "
            "1F1B, Interleaved1F1B, ZBVZeroBubble, DualPipeV; InterleavedZeroBubble and "
            "LoopedBFS are multi-stage schedules, which torchtitan runs with two or more stages "
            "per rank (torchtitan/distributed/pipeline_parallel.py), unlike `zb-h1`, and "
            "LoopedBFS is not modelled. FSDP2 shards gradients and parameters "
            "(`fully_shard`, `reshard_after_forward` never or always: ZeRO-2 or -3) and has no "
            "ZeRO-1; ZeRO-0 is `data_parallel_replicate_degree` with a shard degree of 1 "
            "(torchtitan/models/llama3/parallelize.py, `apply_fsdp_to_decoder`). Under a "
            "pipeline its default `reshard_after_forward_policy` keeps the weights gathered "
            "(\"For PP, do not reshard after forward to avoid per-microbatch all-gathers\", "
            "same file), and PyTorch's pipelining holds whole gradients to reduce them after "
            "the last backward (`perform_reduce_grad`, torch/distributed/pipelining/stage.py) "
            "and leaves each unit gathered from its backward to its next forward: with pp > 1 "
            "ZeRO-3 (`always`) holds ZeRO-2's states and gathers each unit `m + 1` times a "
            "step (`ParallelSpec.deferred_zero3`), never ahead of ZeRO-2, so it is not "
            "searched there. Its Async TP "
            "(`compile.enable_async_tensor_parallel`) is a different overlap from Transformer "
            "Engine's, not modelled: not searched. HSDP, FSDP over a node's data-parallel "
            "ranks and replicated across nodes (`data_parallel_replicate_degree` beside "
            "`data_parallel_shard_degree`, torchtitan/distributed/parallel_dims.py), is "
            "searched beside FSDP over every rank. `ScheduleInterleaved1F1B` walks the "
            "micro-batches in `m // pp` equal rounds and refuses a count they do not divide "
            "(`number_of_rounds`). Context parallelism rotates K/V shards by all-gather (the "
            "default) or round the ring (`context_parallel_rotate_method: alltoall`, "
            "torchtitan/config/job_config.py)"), hybrid_sharding=True, interleaved_in_rounds=True,
        cp_comms=("allgather", "p2p")),
}


def choices(stack: str) -> StackChoices:
    return CHOICES[stack]


def schedule_runs(stack: str, schedule: str, sequence_parallel: bool) -> bool:
    """Whether ``stack`` runs ``schedule`` (with or without sequence parallelism)."""
    c = CHOICES[stack]
    listed = c.schedules is None or schedule in c.schedules
    return listed and not (sequence_parallel and schedule in c.schedules_without_sp)


def torch_interleaved_rounds(pp: int, m: int) -> int | None:
    """The rounds torch's ``ScheduleInterleaved1F1B`` walks ``m`` micro-batches in, ``m // pp``
    of equal size, or None where they do not divide ``m`` and it refuses the count
    (torch/distributed/pipelining/schedules.py, ``number_of_rounds``)."""
    rounds = max(1, m // pp)
    return None if m % rounds else rounds


def microbatches_run(stack: str, schedule: str, pp: int, m: int) -> bool:
    """Whether ``stack`` runs ``schedule`` at ``m`` micro-batches per pipeline, as far as the
    count goes (the schedule's own rule, ``microbatch_rule``, already holds)."""
    if schedule != "interleaved" or not CHOICES[stack].interleaved_in_rounds:
        return True
    return torch_interleaved_rounds(pp, m) is not None


def zero_stages(stack: str, pipelined: bool, precision: str) -> tuple[int, ...]:
    """The ZeRO stages ``stack`` runs on a split, each once: under a pipeline ZeRO-2 runs as
    ZeRO-1 (``ParallelSpec.sharded_gradients``, left out of the lists), and a stage the stack
    runs as another (``frameworks.zero_as_run``) is not tried twice."""
    c = CHOICES[stack]
    stages = c.pipelined_zero_stages if pipelined else c.zero_stages
    return tuple(z for z in stages if frameworks.zero_as_run(stack, z, precision) == z)


def attention_only(modules: list[str] | None) -> bool:
    """Whether selective recomputation of ``recompute_modules`` re-runs the attention core
    alone (Megatron-LM's ``core_attn``, null its default), which fused attention leaves
    nothing to drop from, rather than e.g. torchtitan's op-level checkpointing."""
    return modules in (None, ["core_attn"])


def selective_reruns_attention_only(stack: str) -> bool:
    """``attention_only`` of the stack's default modules (``frameworks.DEFAULTS``)."""
    return attention_only(frameworks.default_value(stack, "parallel.recompute_modules", 0,
                                                   False))


def markdown_table() -> str:
    """``CHOICES`` as docs/frameworks.md prints them."""
    def cell(values: tuple | None) -> str:
        return "every one" if values is None else ", ".join(f"`{v}`" for v in values)

    rows = [
        ("schedules searched", lambda c: cell(c.schedules)
         + (f" (`{'`, `'.join(c.schedules_without_sp)}` without sequence parallelism)"
            if c.schedules_without_sp else "")),
        ("ZeRO stages, pp 1", lambda c: cell(c.zero_stages)),
        ("ZeRO stages, pp > 1", lambda c: cell(c.pipelined_zero_stages)),
        ("`tp_comm_overlap` searched", lambda c: "yes" if c.tp_comm_overlap else "no"),
        ("hybrid sharding searched (`dp_shard`: one copy a node)",
         lambda c: "yes" if c.hybrid_sharding else "no"),
        ("context-parallel exchanges searched (`cp_comm`)", lambda c: cell(c.cp_comms)),
        ("interleaved micro-batches per pipeline", lambda c: (
            "a multiple of their `m // pp` rounds" if c.interleaved_in_rounds
            else "at least `pp`" if c.schedules is None or "interleaved" in c.schedules
            else "-")),
    ]
    stacks = frameworks.FRAMEWORKS
    lines = ["| choice | " + " | ".join(stacks) + " |", "| --- |" + " --- |" * len(stacks)]
    lines += [f"| {name} | " + " | ".join(show(CHOICES[s]) for s in stacks) + " |"
              for name, show in rows]
    lines += ["", *(f"- {s}: {CHOICES[s].source}." for s in stacks)]
    return "\n".join(lines) + "\n"
