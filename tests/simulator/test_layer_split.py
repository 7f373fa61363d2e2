"""``parallel.layer_split``: the embedding and the output layer counted as a layer each when a
pipeline's chunks are filled (torchtitan's default, Megatron-Core's account-for flags)."""

from __future__ import annotations

import pytest

import clustersim
from clustersim.errors import ScenarioError
from clustersim.reports.megatron import megatron_args
from clustersim.reports.torchtitan_args import torchtitan_args
from clustersim.simulator.inputs.scenario import build_scenario
from clustersim.simulator.pipeline.stages import chunk_layers, ends_as_layers, stage_layers


def torchtitan_split(num_stages: int, num_layers: int) -> list[int]:
    """Layers per stage as torchtitan's ``_generate_llm_fqn_per_model_part`` builds them
    (torchtitan/distributed/pipeline_parallel.py @ b5bcd76c, weights 1): its loop, transcribed."""
    effective = num_layers + 2
    per_stage, extra = divmod(effective, num_stages)
    out, current = [], 0
    for stage in range(num_stages):
        take = per_stage + (1 if stage < extra else 0)
        if stage == 0:
            take -= 1  # tok_embeddings
        if stage == num_stages - 1:
            take -= 1  # norm and output
        take = min(take, num_layers - current)
        out.append(take)
        current += take
    return out


@pytest.mark.parametrize("layers, parts", [(32, 4), (80, 8), (126, 128), (61, 16), (96, 12),
                                           (48, 6), (40, 16)])
def test_the_split_is_torchtitans(layers, parts):
    assert list(ends_as_layers(layers, parts)) == torchtitan_split(parts, layers)


def _scenario(**parallel):
    return build_scenario({"model": {"preset": "llama3-8b"},
                           "cluster": {"preset": "dgx-h100", "gpus": 64},
                           "training": {"global_batch": 256, **parallel.pop("training", {})},
                           "parallel": {"tp": 2, "pp": 4, **parallel}})


def test_fsdp_splits_as_torchtitan_does_and_megatron_evenly():
    fsdp = _scenario(training={"framework": "fsdp"})
    assert fsdp.parallel.layer_split == "ends_as_layers"
    assert stage_layers(fsdp) == [8, 9, 8, 7]
    assert stage_layers(_scenario()) == [8, 8, 8, 8]
    given = _scenario(training={"framework": "fsdp"}, layer_split="even")
    assert stage_layers(given) == [8, 8, 8, 8]
    assert stage_layers(_scenario(training={"framework": "fsdp"},
                                  stage_layers=[7, 9, 9, 7])) == [7, 9, 9, 7]


def test_it_is_metas_405b_split():
    """Dubey et al. 2024 (sec. 3.3.2): the first and last of 128 chunks hold the embedding and
    the output layer alone; the same step as the split written out."""
    base = {"model": {"preset": "llama3-405b", "seq_len": 8192},
            "cluster": {"preset": "dgx-h100", "gpus": 8192},
            "training": {"global_batch": 2048},
            "parallel": {"tp": 8, "pp": 16, "dp": 64, "schedule": "interleaved",
                         "virtual_stages": 8, "zero": 1, "sequence_parallel": True}}
    split = build_scenario({**base, "parallel": {**base["parallel"],
                                                 "layer_split": "ends_as_layers"}})
    written = build_scenario({**base, "parallel": {**base["parallel"],
                                                   "stage_layers": [0] + [1] * 126 + [0]}})
    assert chunk_layers(split) == [0] + [1] * 126 + [0]
    assert clustersim.simulate(split).step_time_s == clustersim.simulate(written).step_time_s


def test_the_end_stages_get_lighter():
    """The first and last stages run the embedding and the loss: with their layer fewer, the
    slowest stage, which paces 1F1B, is lighter and the step no longer."""
    even = clustersim.simulate(_scenario(schedule="1f1b"))
    ends = clustersim.simulate(_scenario(schedule="1f1b", layer_split="ends_as_layers"))
    assert ends.step_time_s < even.step_time_s


def test_each_stack_is_told_the_split():
    """Megatron-Core asks that layers + 2 divide into the chunks: 34 do into 2, not into 4."""
    args = megatron_args(_scenario(layer_split="ends_as_layers", pp=2))
    assert "--account-for-embedding-in-pipeline-split" in args
    assert "--account-for-loss-in-pipeline-split" in args
    assert not any(a.startswith("# layers + 2") for a in args)
    assert any(a.startswith("# layers + 2 = 34") for a in megatron_args(
        _scenario(layer_split="ends_as_layers")))
    titan = torchtitan_args(_scenario(training={"framework": "fsdp"}))
    assert not any("less_layers" in a for a in titan)  # torchtitan's own default
    even = torchtitan_args(_scenario(training={"framework": "fsdp"}, layer_split="even"))
    assert "--parallelism.pipeline_parallel_first_stage_less_layers 0" in even


def test_a_stage_left_without_layers_is_one_error():
    """6 layers + 2 over 6 stages: 1, 2, 1, 1, 1 and nothing for the last stage but the
    output layer; clustersim asks every stage to hold a layer, as for stage_layers."""
    with pytest.raises(ScenarioError) as err:
        build_scenario({"model": {"preset": "llama3-8b", "layers": 6},
                        "cluster": {"preset": "dgx-h100", "gpus": 48},
                        "training": {"global_batch": 48},
                        "parallel": {"tp": 8, "pp": 6, "layer_split": "ends_as_layers"}})
    assert err.value.field == "parallel.layer_split"
