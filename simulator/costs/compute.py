"""Compute time of one layer's kernels on one rank, forward and backward, from the profile.

Weight GEMMs are costed by shape (``kernels.py``) where the profile has a ``gemm`` model, else by
the legacy FLOPs curve; each backward GEMM is costed apart (data and weight gradients have other
shapes than the forward). Attention is charged for what runs: fused (flash) kernels compute
about half of the causal square, at the profile's ``attention_efficiency`` (less over short
sequences: ``Profile.attention_fractions``), and their backward 2.5x the forward's FLOPs;
unfused attention runs its two batched GEMMs over the full square, and twice that in backward.
Model FLOPs (MFU) keep the full-square ``6N + 12lhs`` convention
(``workload.model_flops_per_step``). Element-wise kernels move their bytes through HBM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..model import elementwise as ew
from ..model import recompute
from ..model import workload as wl
from ..model.kernels import Gemm, quantisation
from ..model.param_counts import layer_params_per_rank

if TYPE_CHECKING:
    from ..inputs.scenario import Scenario
    from ..inputs.specs import ParallelSpec
    from .cost_model import CostModel


@dataclass(frozen=True, slots=True)
class PassTimes:
    """Compute times of one layer's forward (or backward) by kernel family, and the time the
    GPU waits for the host to issue them (``host_floor``)."""

    gemms: float
    attention: float
    elementwise: float
    host_wait: float = 0.0

    @property
    def total(self) -> float:
        return self.gemms + self.attention + self.elementwise + self.host_wait


def host_floor(times: PassTimes, host_s: float) -> PassTimes:
    """A pass takes at least the host's time to issue its kernels: eager PyTorch spends tens of
    microseconds of Python, autograd and launch per GPU operation, and the GPU cannot run ahead
    of the host that feeds it (measured: benchmarks/gpu_layers.py, the profile's
    ``host_layer_s``). Kernels that take longer hide the host entirely."""
    kernels = times.gemms + times.attention + times.elementwise
    return PassTimes(times.gemms, times.attention, times.elementwise,
                     max(0.0, host_s - kernels))


def gemm_time(cm: CostModel, g: Gemm, tokens: int | None = None, fp8: bool = False) -> float:
    """One GEMM: by shape where the profile has a GEMM model (the slower of its compute at the
    quantised ceiling and its operands through HBM, plus the kernel's fixed time), else by the
    FLOPs curve; plus the per-kernel overhead either way. An ``fp8`` GEMM runs at the FP8 peak
    with 1-byte operands at the profile's ``fp8_ceiling``, or, where none was measured, at the
    same fraction of its peak as bf16 reaches of its own (an assumption the README's FP8
    section checks against published speed-ups)."""
    if g.flops <= 0:
        return 0.0
    peak = cm.gemm_peak if fp8 else cm.peak
    model = cm.profile.gemm
    if model is None:
        return cm.matmul(g.flops, tokens) * cm.peak / peak
    sms = cm.s.cluster.gpu.sm_count
    ceiling = model.fp8_ceiling if fp8 and model.fp8_ceiling else model.ceiling
    eff = ceiling * quantisation(g, sms, model.tiles) * g.k / (g.k + model.k_overhead)
    compute = g.flops / (peak * eff)
    width = wl.GEMM_OPERAND_BYTES["fp8"] if fp8 else wl.BYTES[cm.s.training.precision]
    memory = g.operand_bytes(width) / cm.hbm
    return max(compute, memory) + model.fixed_s + cm.profile.kernel_overhead_s


def weight_gemm_time(cm: CostModel, g: Gemm, tokens: int | None = None) -> float:
    """A transformer layer's weight GEMM (or its data or weight gradient): FP8 under fp8."""
    return gemm_time(cm, g, tokens, fp8=cm.fp8)


def fp8_cast_bytes(cm: CostModel, k: wl.LayerKernels) -> tuple[float, float]:
    """HBM bytes of the FP8 copies Transformer Engine makes per layer and micro-batch,
    (forward, backward), as its modules run them (transformer_engine/pytorch/module/linear.py,
    layernorm_linear.py, TE 1.x). Hopper's FP8 GEMMs take only the TN layout, so every FP8
    operand is also needed transposed: one byte per element each copy.

    - A column-parallel GEMM's input (QKV, FC1; MLA's up-projections, their latent norms
      fused) is the fused layer norm's output, which TE writes in FP8 instead of bf16
      (``ln_out``): the norm's own bytes (``workload._elementwise_bytes``) stand for it;
      backward transposes it for the weight gradient (``fp8_transpose``: read 1, write 1).
    - A row-parallel, expert or duplicated GEMM's input (the attention output, the
      activation's, the norm output MLA's down-projections read) is cast on its own: bf16
      read and FP8 written (3), its transpose written in the same kernel
      (``fp8_cast_transpose_fused``, 1) or, under sequence parallelism, made in backward
      (``fp8_transpose``, 2), but for a duplicated GEMM, which reads its own shard.
    - Every GEMM's output gradient arrives in bf16 and is cast with its transpose
      (``fp8_cast_transpose_bgrad_fused``): read 2, write 2; a row-parallel GEMM's under
      sequence parallelism is cast on the rank's shard, gathered in FP8 and then transposed
      whole (``grad_output_preprocess``, base.py): ``3 / tp + 2`` per element.
    - Each weight is cast with its transpose once a step, on the first micro-batch
      (``is_first_microbatch``; read 2, write 2 per parameter): a 1/m share per micro-batch;
      FP8 parameters (``fp8_param_gather``) only make their transpose (read 1, write 1).

    A gated MLP's gate and up projections share one input: it is cast once."""
    if not cm.fp8:
        return 0.0, 0.0
    s = cm.s
    sp = s.parallel.sequence_parallel
    roles = wl.gemm_roles(s)
    shared_input = wl.shared_input_runs(s)
    forward = backward = 0.0
    for i, ((g, launches), role) in enumerate(zip(k.gemm_runs, roles, strict=True)):
        inputs = g.m * g.k * g.batch * launches / (s.model.ffn_matrices - 1
                                                    if i in shared_input else 1)
        outputs = g.m * g.n * g.batch * launches
        backward += outputs * (3 / s.parallel.tp + 2 if sp and role == "row" else 4)
        if role == "column":
            backward += 2 * inputs
        else:  # a duplicated GEMM reads its own shard: cast and transposed at once
            deferred = sp and role != "duplicated"
            forward += 3 * inputs if deferred else 4 * inputs
            backward += 2 * inputs if deferred else 0.0
    params = sum(layer_params_per_rank(s.model, s.parallel.tp, s.parallel.ep, s.parallel.etp))
    weight_bytes = 2 if s.training.fp8_param_gather else 4
    return forward + weight_bytes * params / s.microbatches, backward


def backward_gemm_time(cm: CostModel, g: Gemm, tokens: int | None = None,
                       fp8: bool = False) -> float:
    """Data gradient and weight gradient of one forward GEMM."""
    return gemm_time(cm, g.dgrad(), tokens, fp8) + gemm_time(cm, g.wgrad(), tokens, fp8)


def attention_times(cm: CostModel, k: wl.LayerKernels) -> tuple[float, float]:
    """(forward, backward) of the attention core (scores, softmax-weighted values)."""
    if cm.s.training.flash_attention:
        executed = k.attention * wl.CAUSAL_FRACTION
        eff, backward_eff = cm.profile.attention_fractions(cm.s.training.attention_kernel,
                                                           attended_keys(cm.s))
        if eff is None:  # no figure of its own: as GEMMs of the same work
            forward = sum(gemm_time(cm, _scaled(g, wl.CAUSAL_FRACTION), k.tokens)
                          for g in k.attention_gemms)
            return forward, wl.FLASH_BACKWARD_RATIO * forward
        overhead = cm.profile.kernel_overhead_s
        return (executed / (cm.peak * eff) + overhead,
                wl.FLASH_BACKWARD_RATIO * executed / (cm.peak * backward_eff) + overhead)
    forward = sum(gemm_time(cm, g, k.tokens) for g in k.attention_gemms)
    return forward, sum(backward_gemm_time(cm, g, k.tokens) for g in k.attention_gemms)


def attended_keys(s: Scenario) -> float:
    """Keys one fused attention call runs a query row over: the sequence, or under context
    parallelism the ``s/cp`` a rank holds, which each step of the ring attends to
    (Transformer Engine's context-parallel attention, one kernel call per step)."""
    return s.model.seq_len / s.parallel.cp


def _scaled(g: Gemm, fraction: float) -> Gemm:
    return Gemm(g.m * fraction, g.n, g.k, g.batch)


def sharding_reads(p: ParallelSpec) -> tuple[bool, bool]:
    """What ``weight_traffic_bytes`` reads of how data parallelism shards (the only read of
    it among one layer's costs, ``cost_model.layer_key``): whether gradients are sharded,
    whether whole weights are kept (below ZeRO-2)."""
    return p.sharded_gradients, p.zero < 2


def weight_traffic_bytes(cm: CostModel, params: float) -> tuple[float, float]:
    """(forward, backward) bytes per micro-batch that ``params`` of this rank's weights move
    outside the GEMMs, on average over the step's micro-batches.

    - Unfused gradient accumulation (``grad_accumulation_fusion`` false): every micro-batch
      after the first adds its gradient into the buffer in a kernel of its own, reading the
      new gradient and the buffer and writing the buffer, 3 x the gradient's bytes per
      parameter; into the shard where gradients are reduce-scattered every micro-batch.
    - Weights kept in fp32 and cast per use (``master_weights: params`` below ZeRO-2,
      PyTorch autocast): each forward reads the fp32 weight and writes its bf16 copy, and
      each backward casts the bf16 weight gradient back (2 + 4 bytes each way). FSDP2 at
      ZeRO-2 and -3 casts the shard before its all-gather (``FSDPParam.all_gather_inputs``,
      torch/distributed/fsdp/_fully_shard/_fsdp_param.py) and computes on the gathered bf16
      weights: a 1/dp share, left out.
    Megatron-LM pays neither: bf16 weights, and the weight-gradient GEMM accumulates into the
    fp32 ``main_grad`` (``--gradient-accumulation-fusion``)."""
    t, p, m = cm.s.training, cm.s.parallel, cm.s.microbatches
    forward = backward = 0.0
    if not t.grad_accumulation_fusion and m > 1:
        shards = p.state_shards if p.sharded_gradients else 1
        backward += (m - 1) / m * 3 * wl.BYTES[t.grad_dtype] * params / shards
    if t.master_weights == "params" and t.precision in ("bf16", "fp16") and p.zero < 2:
        cast = (wl.BYTES["fp32"] + wl.BYTES[t.precision]) * params
        forward, backward = forward + cast, backward + cast
    return forward, backward


def layer_weight_traffic(cm: CostModel) -> tuple[float, float]:
    """``weight_traffic_bytes`` of one layer's weights on this rank."""
    p = cm.s.parallel
    return weight_traffic_bytes(cm, sum(layer_params_per_rank(cm.s.model, p.tp, p.ep, p.etp)))


def layer_pass_times(cm: CostModel) -> tuple[PassTimes, PassTimes]:
    """(forward, backward) of one layer for one micro-batch, recomputation excluded. Each
    distinct GEMM shape is costed once and counted as often as it is launched."""
    k = wl.layer_kernels(cm.s)
    attention_fwd, attention_bwd = attention_times(cm, k)
    weights_fwd, weights_bwd = layer_weight_traffic(cm)
    elementwise = cm.memory_bound(k.memory_bytes)
    cast_fwd, cast_bwd = fp8_cast_bytes(cm, k)
    cast_fwd, cast_bwd = cast_fwd + weights_fwd, cast_bwd + weights_bwd
    splits = userbuffer_splits(cm)
    runs = list(zip(k.gemm_runs, wl.gemm_roles(cm.s), strict=True))
    forward = PassTimes(sum(n * _split_time(cm, g, k.tokens, splits.get(("fprop", r), 1))
                            for (g, n), r in runs),
                        attention_fwd, elementwise + cm.memory_bound(cast_fwd))
    backward = PassTimes(sum(n * (_split_time(cm, g.dgrad(), k.tokens,
                                              splits.get(("dgrad", r), 1))
                                  + weight_gemm_time(cm, g.wgrad(), k.tokens))
                             for (g, n), r in runs),
                         attention_bwd,
                         cm.memory_bound(k.backward_memory_bytes) + cm.memory_bound(cast_bwd))
    host_fwd, host_bwd = cm.profile.host_layer_s
    return host_floor(forward, host_fwd), host_floor(backward, host_bwd)


def tp_overlaps(cm: CostModel) -> bool:
    """``tp_comm_overlap`` hides TP collectives only when the TP group stays inside one node's
    NVLink domain (Megatron-Core's userbuffers overlap is intra-node); a TP group spanning
    nodes is allowed and fully exposed."""
    return cm.s.parallel.tp_comm_overlap and cm.tp.nodes == 1



# Transformer Engine's default userbuffers overlap (transformer_engine/pytorch/module/base.py,
# initialize_ub): "ring_exchange" for qkv/fc1 fprop and proj/fc2 dgrad splits the GEMM into tp
# chunks, one per ring step; "pipeline" for proj/fc2 fprop splits it into 4 (num_splits 4);
# "bulk" (the column layers' dgrad and wgrad) runs the GEMM whole beside the collective.
UB_PIPELINE_SPLITS = 4
# ... and runs up to 3 pieces at once on its own streams (``_NUM_MAX_UB_STREAMS = 3``, same
# file), so the pieces share the SMs like one GEMM of their rows together.
UB_STREAMS = 3


def userbuffer_splits(cm: CostModel) -> dict[tuple[str, str], int]:
    """How many pieces ``tp_comm_overlap`` cuts each kind of GEMM into, ``(pass, role) ->
    pieces``; empty when the TP collectives are not overlapped that way. Each piece is a GEMM
    of its own (quantisation, launch), which is what the overlap costs in compute."""
    if not tp_overlaps(cm):
        return {}
    tp = cm.s.parallel.tp
    return {("fprop", "column"): tp, ("fprop", "row"): UB_PIPELINE_SPLITS, ("dgrad", "row"): tp}


def _split_time(cm: CostModel, g: Gemm, tokens: int, pieces: int) -> float:
    """A weight GEMM run as ``pieces`` GEMMs over ``m / pieces`` rows each, ``UB_STREAMS`` of
    them at a time: ``pieces / concurrent`` rounds, each like one GEMM of their rows."""
    if pieces == 1:
        return weight_gemm_time(cm, g, tokens)
    concurrent = min(UB_STREAMS, pieces)
    rows = g.m * concurrent / pieces
    return pieces / concurrent * weight_gemm_time(cm, Gemm(rows, g.n, g.k, g.batch), tokens)


def column_backward_times(cm: CostModel) -> tuple[float, float]:
    """(data-gradient, weight-gradient) GEMM times of one layer's column-parallel GEMMs (QKV,
    FC1, the shared experts' FC1) per micro-batch: what Megatron-LM's backward hides its
    tensor-parallel collectives behind (``layer_comm.backward_overlap``)."""
    k = wl.layer_kernels(cm.s)
    columns = [run for run, r in zip(k.gemm_runs, wl.gemm_roles(cm.s), strict=True)
               if r == "column"]
    return (sum(n * weight_gemm_time(cm, g.dgrad(), k.tokens) for g, n in columns),
            sum(n * weight_gemm_time(cm, g.wgrad(), k.tokens) for g, n in columns))


def weight_gradient_times(cm: CostModel) -> tuple[float, float]:
    """The weight-gradient GEMMs (``dW = X^T dY``) of one layer and of the output layer, per
    micro-batch: the part of a backward a zero-bubble schedule runs apart (its ``W``; Qi et al.
    2024, sec. 2). The rest of the backward — data gradients, attention and element-wise
    backward, recomputation — is its input-gradient pass (``B``, PyTorch's ``I``). Run apart,
    they are the same kernels with the same fused accumulation, so they cost the same here;
    what the split does cost (cover, memory) is ``split_backward.py``'s."""
    k = wl.layer_kernels(cm.s)
    layer = sum(n * weight_gemm_time(cm, g.wgrad(), k.tokens) for g, n in k.gemm_runs)
    head, mtp = wl.logits_gemm(cm.s), cm.s.model.mtp_layers
    wgrad = gemm_time(cm, head.wgrad(), head.m)
    if mtp:
        proj = wl.mtp_projection_gemm(cm.s)
        wgrad += mtp * (wgrad + gemm_time(cm, proj.wgrad(), proj.m))
    return layer, wgrad


def logits_times(cm: CostModel) -> tuple[float, float]:
    """(forward, backward) of the output layer and the loss, per micro-batch; the output
    layer's weights move what ``weight_traffic_bytes`` says, as a layer's do. Each
    multi-token prediction module (``mtp_layers``) runs them again on its own hidden state,
    after projecting its two normed inputs down (``mtp_projection_gemm``); its layer is one
    of the last chunk's (``stages.chunk_mix``)."""
    g = wl.logits_gemm(cm.s)
    _, loss_bytes = wl.logits_kernels(cm.s)
    loss = cm.memory_bound(loss_bytes)
    weights_fwd, weights_bwd = weight_traffic_bytes(cm, g.n * g.k)
    forward = gemm_time(cm, g, g.m) + loss + cm.memory_bound(weights_fwd)
    backward = backward_gemm_time(cm, g, g.m) + loss + cm.memory_bound(weights_bwd)
    mtp = cm.s.model.mtp_layers
    if mtp:
        proj = wl.mtp_projection_gemm(cm.s)
        forward += mtp * (forward + gemm_time(cm, proj, proj.m))
        backward += mtp * (backward + backward_gemm_time(cm, proj, proj.m))
    return forward, backward


# --- recomputation (what each module re-runs: recompute.py) ---------------------------

def kernel_times(cm: CostModel) -> tuple[tuple[float, float], tuple[float, float]]:
    """One layer's GEMM and attention-core times, (forward, backward) each, recomputation
    included in backward: what TP and CP collectives can hide behind."""
    fwd, bwd = cm.passes
    gemms_rerun = {"none": 0.0, "full": fwd.gemms,
                   "selective": rerun_gemm_time(cm)}[cm.s.parallel.recompute]
    return ((fwd.gemms, bwd.gemms + gemms_rerun),
            (fwd.attention, bwd.attention + rerun_attention_time(cm)))


def rerun_attention_time(cm: CostModel) -> float:
    """The attention core's forward, re-run in backward under full recomputation and under
    selective with ``core_attn``: Megatron-Core checkpoints the core attention whatever runs
    it (Attention.forward: ``if self.checkpoint_core_attention and self.training``), so a
    fused kernel's forward re-runs too."""
    p = cm.s.parallel
    rerun = p.recompute == "full" or "core_attn" in p.recomputed
    return cm.passes[0].attention if rerun else 0.0


def rerun_gemm_time(cm: CostModel) -> float:
    """The weight GEMMs selective recomputation re-runs per layer (``recompute.rerun_gemms``:
    MLA's up-projections under ``mla_up_proj``)."""
    return sum(weight_gemm_time(cm, g, g.m) for g in recompute.rerun_gemms(cm.s))


def rerun_bytes(s: Scenario) -> float:
    """HBM bytes of the element-wise kernels one layer re-runs per micro-batch and rank: the
    unfused attention core's softmax and dropout (``elementwise.attention_score_bytes``); each
    recomputed norm reads and writes ``T h / o`` elements; the recomputed activation reads
    fc1's output and writes its own, ``ffn_matrices x R f / t`` elements for the ``R`` routed
    rows (as ``elementwise.norm_activation_bytes`` counts the forward's), and under ``mlp`` a
    dense layer's fused FC1 norm and activation over all its ``T`` rows; ``op_sac`` re-runs every
    element-wise kernel of the forward (norms, residual adds, the activation: all the layer's
    ops but its matmuls and the fused attention kernel, ``recompute.py``)."""
    m, p, t = s.model, s.parallel, s.training
    if "op_sac" in p.recomputed:
        return wl.layer_kernels(s).memory_bytes
    e = wl.BYTES[t.precision]
    tokens = t.micro_batch * m.seq_len // p.cp
    outer = p.tp if p.sequence_parallel else 1
    total = 0.0
    if "core_attn" in p.recomputed:
        total += ew.attention_score_bytes(s, tokens, e)
    if "layernorm" in p.recomputed:
        separate_norms = int(m.mla) + int(m.experts > 1)
        total += separate_norms * 2 * e * tokens * m.hidden / outer
    if "moe_act" in p.recomputed and m.experts > 1:
        routed = tokens * m.top_k * wl.expert_load(s)
        total += m.ffn_matrices * e * routed * m.ffn_hidden / p.tp
    if "mlp" in p.recomputed and m.experts == 1:  # FC1's fused norm, then the activation
        total += e * tokens * (2 * m.hidden / outer + m.ffn_matrices * m.ffn_hidden / p.tp)
    return total
