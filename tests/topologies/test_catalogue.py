"""The hardware catalogue and cluster presets load, validate and carry their sources."""

from __future__ import annotations

import json
import re
from importlib.resources import files

import pytest

from clustersim.simulator.inputs.scenario import build_cluster
from clustersim.topologies.hardware import GpuSpec, cluster_presets, gpu_presets
from clustersim.topologies.profile import profile_for_gpu

REQUIRED_GPUS = {"a100-40gb", "a100-80gb", "h100-sxm", "h200", "b200"}
REQUIRED_CLUSTERS = {"dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100", "dgx-h200", "pcie-ethernet"}


def test_required_presets_are_shipped():
    assert set(gpu_presets()) >= REQUIRED_GPUS
    assert set(cluster_presets()) >= REQUIRED_CLUSTERS


@pytest.mark.parametrize("gpu_id", sorted(REQUIRED_GPUS))
def test_gpu_entries_validate_and_cite(gpu_id):
    gpu = GpuSpec.model_validate({**gpu_presets()[gpu_id], "id": gpu_id})
    assert gpu.source
    assert gpu.peak_flops["bf16"] >= gpu.peak_flops["fp32"]


def test_published_peaks():
    """A100 312 TFLOP/s bf16 (Narayanan et al. 2021); H100 SXM 989 (Megatron-LM's MFU base)."""
    gpus = gpu_presets()
    assert gpus["a100-80gb"]["peak_flops"]["bf16"] == 312e12
    assert gpus["h100-sxm"]["peak_flops"]["bf16"] == pytest.approx(989e12, rel=1e-3)


def test_memory_is_what_cuda_reports_not_nvidia_smi():
    """Our own H100 and H200 report to PyTorch less than nvidia-smi's total (device.json beside
    nvidia-smi.csv, measurements/own), and a training process keeps 1.29 GiB outside its tensors
    (the 6.7B run's OOM message there): what tensors may use is the difference."""
    own = files("clustersim.topologies") / "measurements" / "own"
    for gpu_id, run in (("h100-sxm", "2026-11-25-h100-sxm"), ("h200", "2026-11-25-h200")):
        device = json.loads((own / run / "device.json").read_text())
        smi_mib = int((own / run / "nvidia-smi.csv").read_text().splitlines()[1].split(",")[1]
                      .strip().split()[0])
        gpu = GpuSpec.model_validate({**gpu_presets()[gpu_id], "id": gpu_id})
        assert gpu.memory_bytes == device["memory_bytes"] < smi_mib * 2**20
    oom = (own / "2026-11-25-h100-sxm" / "validate-gpt-6.7b.error.txt").read_text()
    in_use, allocated, unallocated = (float(re.search(pattern, oom).group(1)) for pattern in (
        r"this process has ([\d.]+) GiB memory in use", r"([\d.]+) GiB is allocated by PyTorch",
        r"([\d.]+) MiB is reserved by PyTorch but unallocated"))
    runtime = in_use - allocated - unallocated / 1024
    h100 = GpuSpec.model_validate({**gpu_presets()["h100-sxm"], "id": "h100-sxm"})
    assert h100.runtime_bytes / 2**30 == pytest.approx(runtime, abs=0.01)
    assert h100.tensor_memory_bytes == h100.memory_bytes - h100.runtime_bytes


GPU_CLUSTERS = sorted(name for name in cluster_presets() if name != "localhost-gloo")


@pytest.mark.parametrize("name", GPU_CLUSTERS)
def test_cluster_presets_resolve(name):
    cluster = build_cluster({"preset": name})
    # Eight GPUs to a node, but a GB200 NVL72 rack is one 72-GPU NVLink domain.
    assert cluster.gpus_per_node == (72 if name == "gb200-nvl72" else 8)
    assert cluster.intra_node.bandwidth > cluster.inter_node.bandwidth
    assert profile_for_gpu(cluster.gpu.id).comm_eff("inter_node") <= 1


def test_the_validation_machine_is_one_node_of_cpu_cores():
    """``localhost-gloo`` describes the ranks of a real CPU run: one machine, one tier."""
    cluster = build_cluster({"preset": "localhost-gloo", "gpus": 4})
    assert cluster.gpu.id == "cpu-core" and cluster.nodes == 1
    assert cluster.tier_of_span(4)[0] == "intra_node"


def test_tier_of_a_span():
    c = build_cluster({"preset": "llama3-h100-roce"})
    assert c.tier_of_span(8)[0] == "intra_node"
    assert c.tier_of_span(3072)[0] == "inter_node"
    assert c.tier_of_span(3073)[0] == "spine"


def test_whole_nodes_only():
    from clustersim.errors import ScenarioError
    with pytest.raises(ScenarioError, match="cluster"):
        build_cluster({"preset": "dgx-h100", "gpus": 12})


def test_presets_say_which_profiles_were_not_measured_on_their_gpu():
    """``clustersim presets --json``: each GPU names its profile and where its figures come
    from; a GPU priced by another GPU's or the generic profile says so."""
    from clustersim.reports.tables import preset_rows

    basis = {g["name"]: g["profile"] for g in preset_rows()["gpus"]}
    assert basis["h100-sxm"] == "h100-sxm: fitted on megatron-core-h100"
    assert basis["h200"] == "h200: from h100-sxm, not measured on this GPU"
    assert basis["h800"] == "h800: from h100-sxm, not measured on this GPU"
    assert basis["mi300x"].endswith("not measured on this GPU")
    assert basis["b200"] == "b200: GEMMs and attention measured on it, the rest from h100-sxm"
    assert basis["gb200"] == "gb200: GEMMs and attention measured on it, the rest from b200"
