"""Shrink a scenario to what this machine can run for real, keeping its split.

TP, CP, PP, the schedule, ZeRO and sequence parallelism stay as given; data parallelism takes
the ranks left over (``nproc / (tp * cp * pp)``). The model keeps its kind (GELU or SwiGLU,
MHA or GQA) but is capped in width, depth, vocabulary and sequence so that a step takes
seconds on CPU cores; features the harness does not build (biases, RMSNorm, RoPE, tied embeddings,
recomputation) are set to what it does build, and every change is reported. The result is a
valid scenario on the local cluster, which the simulator then predicts.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from clustersim.errors import ScenarioError
from clustersim.simulator.inputs.scenario import Scenario, build_scenario

from .machine import default_nproc, local_cluster


@dataclass(frozen=True)
class Caps:
    """The largest model a real run on this backend may use."""

    hidden: int
    layers: int
    vocab: int
    seq_len: int
    microbatches: int
    micro_batch: int
    experts: int


CAPS = {"gloo": Caps(hidden=512, layers=16, vocab=8192, seq_len=256, microbatches=16,
                     micro_batch=1, experts=8),
        "nccl": Caps(hidden=4096, layers=32, vocab=32768, seq_len=2048, microbatches=16,
                     micro_batch=4, experts=64)}
# The harness's GPT (validation/model.py) has no dropout: no masks are kept. Its experts
# (validation/moe.py) are routed ones in every layer, to padded buffers (a capacity factor).
HARNESS_MODEL = {"norm": "layernorm", "bias": False, "position_embedding": "learned",
                 "tie_embeddings": False, "dropout": 0.0, "shared_experts": 0,
                 "dense_layers": 0, "expert_groups": None, "expert_groups_per_token": None,
                 "mtp_layers": 0}
# How the harness trains (train.py): fp32 parameters (and, under bf16, autocast's casts of
# them in every forward), fp32 gradients summed over micro-batches by autograd's AccumulateGrad,
# torch.optim.AdamW as it comes: foreach on GPUs (on CPUs a loop over the tensors, whose
# temporaries are one tensor's; no CPU run measures memory), its moments in the parameters'
# fp32, and F.cross_entropy for the loss (model.py, ``lm_loss``).
HARNESS_TRAINING = {"grad_dtype": "fp32", "master_weights": "params", "optimizer_moments": "fp32",
                    "grad_accumulation_fusion": False, "flash_attention": True,
                    "optimizer_impl": "foreach", "loss_kernel": "pytorch"}
# The harness's TP (validation/model.py) all-reduces synchronously inside autograd: no
# collective runs beside a GEMM.
# Its pipeline (validation/pipeline.py) sends each stage's whole output from every TP rank.
# The context-parallel exchanges the harness builds (context.py); not the hierarchical a2a+p2p.
CP_COMMS = ("p2p", "allgather", "a2a")
HARNESS_PARALLEL = {"recompute": "none", "tp_comm_overlap": False, "tp_backward_overlap": False,
                    "pp_scatter_gather": False,
                    "stage_layers": None}


def shrink(s: Scenario, backend: str, nproc: int | None) -> tuple[Scenario, list[str]]:
    """(the scenario as it will run here, what changed and why)."""
    p = s.parallel
    _refuse_unsupported(s, backend)
    per_replica = p.tp * p.cp * p.pp
    if nproc is None:
        nproc = per_replica * min(p.dp, max(1, default_nproc(backend) // per_replica))
    if nproc % per_replica:
        raise ScenarioError("--nproc", f"{nproc} ranks cannot hold whole replicas of "
                                       f"tp x cp x pp = {per_replica}")
    notes: list[str] = []
    caps = CAPS[backend]
    dp = nproc // per_replica
    experts = _expert_parallel(s, dp, notes)
    if experts["ep"] > 1 and p.zero > 0 and dp > 1:  # ZeRO over one replica shards nothing
        raise ScenarioError("parallel.zero", "the real-run harness shards no expert weights: "
                                             "experts spread over ranks (ep > 1) need zero 0")
    model = _shrunk_model(s, caps, notes, experts["ep"])
    m = min(s.microbatches, caps.microbatches)
    mb = min(s.training.micro_batch, caps.micro_batch)
    if p.pp > 1 and m < p.pp:
        m = p.pp
    if (dp, m, mb) != (p.dp, s.microbatches, s.training.micro_batch):
        notes.append(f"batch: dp {p.dp} -> {dp}, micro-batches {s.microbatches} -> {m}, "
                     f"micro-batch {s.training.micro_batch} -> {mb}")
    precision = _harness_precision(s.training.precision, backend, notes)
    training = {**s.training.model_dump(), "global_batch": dp * m * mb, "micro_batch": mb,
                "precision": precision, "tokens": None, **harness_training(precision)}
    parallel = {**p.model_dump(), "dp": dp, **HARNESS_PARALLEL, **experts}
    if p.pp == 1 and p.schedule != "1f1b":  # one stage: every schedule is the same work
        parallel.update(schedule="1f1b", virtual_stages=1)
        notes.append(f"parallel.schedule: {p.schedule} -> 1f1b (one pipeline stage)")
    for key, value in HARNESS_PARALLEL.items():
        if getattr(p, key) != value and value is not None:
            notes.append(f"parallel.{key}: {getattr(p, key)} -> {value} (not in the harness)")
    if p.dp_shard is not None:  # its ZeRO (DDP, FSDP) shards over every replica
        parallel["dp_shard"] = None
        notes.append(f"parallel.dp_shard: {p.dp_shard} -> null (the harness shards over "
                     "every replica)")
    cluster = local_cluster(backend, nproc).model_dump()
    cluster["preset"] = cluster.pop("name")
    raw = {"name": f"{s.name}-shrunk", "model": model, "cluster": cluster,
           "training": training, "parallel": parallel}
    return build_scenario(raw), notes


def harness_training(precision: str) -> dict:
    """The training fields the harness runs ``precision`` with: ``HARNESS_TRAINING``, and
    autocast wherever it trains reduced precision (train.py's ``_autocast``)."""
    return {**HARNESS_TRAINING, "autocast": precision != "fp32"}


def _harness_precision(precision: str, backend: str, notes: list[str]) -> str:
    """fp32 on CPUs; on GPUs bf16 autocast for any reduced precision (train.py, RunConfig)."""
    runs = "fp32" if backend == "gloo" or precision == "fp32" else "bf16"
    if runs != precision:
        why = "the harness trains fp32 on CPUs" if runs == "fp32" else \
            "the harness trains reduced precision as bf16 autocast"
        notes.append(f"precision: {precision} -> {runs} ({why})")
    return runs


def _expert_parallel(s: Scenario, dp: int, notes: list[str]) -> dict:
    """The experts' split as the harness runs it: EP over consecutive DP ranks, or folded
    over a stage's TP x DP ranks (the largest degree of the scenario's that divides them),
    through all-to-all."""
    p = s.parallel
    ranks = dp * (p.tp if p.folded else 1)
    ep = gcd(p.ep, ranks)
    if ep != p.ep:
        notes.append(f"parallel.ep: {p.ep} -> {ep} (of {'tp x dp' if p.folded else 'dp'} "
                     f"{ranks})")
    if s.model.experts > 1 and p.moe_dispatcher != "alltoall":
        notes.append(f"parallel.moe_dispatcher: {p.moe_dispatcher} -> alltoall "
                     "(the harness's dispatch)")
    return {"ep": ep, "moe_dispatcher": "alltoall",
            "expert_tp": 1 if p.folded and s.model.experts > 1 else None}


def _refuse_unsupported(s: Scenario, backend: str) -> None:
    p = s.parallel
    if p.cp > 1:
        _refuse_context(s, backend)
    if p.zero >= 2 and p.pp > 1:
        raise ScenarioError("parallel.zero", "the harness runs ZeRO-2/3 (FSDP) only with pp 1")
    if p.order != "tp-cp-dp-pp":
        raise ScenarioError("parallel.order", "the harness numbers ranks tp-cp-dp-pp only")


def _refuse_context(s: Scenario, backend: str) -> None:
    """Context parallelism runs on CPUs (its blocks call PyTorch's CPU attention kernel with
    its log-sum-exp), by the exchanges context.py builds, over dense softmax attention."""
    p = s.parallel
    if backend != "gloo":
        raise ScenarioError("parallel.cp", "the real-run harness runs context parallelism on "
                                           "gloo (CPUs) only: --backend gloo")
    if p.cp_comm not in CP_COMMS:
        raise ScenarioError("parallel.cp_comm", f"{p.cp_comm}: the real-run harness runs "
                                                f"{', '.join(CP_COMMS)}")
    if s.model.experts > 1 or s.model.mla:
        raise ScenarioError("parallel.cp", "the real-run harness runs experts and latent "
                                           "attention without context parallelism: set "
                                           "parallel.cp=1")


def _shrunk_model(s: Scenario, caps: Caps, notes: list[str], ep: int) -> dict:
    m, p = s.model, s.parallel
    chunks = p.pp * p.virtual_stages if p.pp > 1 else 1
    hidden = min(m.hidden, caps.hidden)
    heads, kv_heads = m.heads, m.kv_heads
    if hidden < m.hidden:
        ratio = m.heads // m.kv_heads
        heads = max(hidden // 64, p.tp)
        kv_heads = max(heads // ratio, 1)
    layers = max(min(m.layers, caps.layers) // chunks * chunks, chunks)
    vocab = min(m.vocab, caps.vocab) // p.tp * p.tp
    ffn = max(round(m.ffn_hidden * hidden / m.hidden / (64 * p.tp)), 1) * 64 * p.tp
    parts = p.tp * 2 * p.cp  # TP's sequence-parallel parts of each CP rank's two chunks
    seq = max(min(m.seq_len, caps.seq_len) // parts, 1) * parts
    shape = {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads,
             "ffn_hidden": ffn, "vocab": vocab, "seq_len": seq,
             "head_dim": m.head_dim}  # a head width of its own is kept (Qwen3's 128)
    if m.experts > 1:
        shape.update(_shrunk_experts(m, ep, caps))
    if m.mla:
        shape.update(_shrunk_latents(m, hidden))
    changed = [f"{k} {getattr(m, k)} -> {v}" for k, v in shape.items() if getattr(m, k) != v]
    if changed:
        notes.append("model: " + ", ".join(changed))
    features = [f"{k} {getattr(m, k)} -> {v}" for k, v in HARNESS_MODEL.items()
                if getattr(m, k) != v]
    if features:
        notes.append("model features as the harness builds them: " + ", ".join(features))
    return {"name": m.name, **shape, "ffn_kind": m.ffn_kind, **HARNESS_MODEL}


def _shrunk_experts(m, ep: int, caps: Caps) -> dict:
    """At most ``caps.experts`` experts (a multiple of ep), the same top_k where they allow
    it, and a capacity factor: the harness pads every expert's buffer to its capacity, so a
    dropless model runs at 1.0."""
    experts = max(min(m.experts, caps.experts) // ep * ep, ep)
    return {"experts": experts, "top_k": min(m.top_k, experts),
            "capacity_factor": m.capacity_factor or 1.0}


def _shrunk_latents(m, hidden: int) -> dict:
    """MLA's latents narrowed with the hidden size (multiples of 64); its per-head widths
    kept, as a head width of its own is, but the values as wide as the queries and keys:
    PyTorch's fused attention on CPUs needs one width, and with two it falls back to the math
    path, which keeps the scores (the model's fused kernel keeps none)."""
    def narrowed(rank: int | None) -> int | None:
        return None if rank is None else max(round(rank * hidden / m.hidden / 64), 1) * 64
    return {"q_lora_rank": narrowed(m.q_lora_rank), "kv_lora_rank": narrowed(m.kv_lora_rank),
            "qk_nope_head_dim": m.qk_nope_head_dim, "qk_rope_head_dim": m.qk_rope_head_dim,
            "v_head_dim": m.qk_nope_head_dim + m.qk_rope_head_dim}
