"""The kernel sweep (validation/kernels.py): its rows count FLOPs and bytes by the closed forms
the profile is derived with, and it refuses to pass a CPU off as a measurement."""

from __future__ import annotations

import csv

import pytest

pytest.importorskip("torch")

from clustersim.validation import kernels  # noqa: E402


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("kernels")
    assert kernels.main(["--out", str(out), "--quick"]) == 0
    with (out / "kernels.csv").open() as f:
        return list(csv.DictReader(f))


def test_a_gemm_counts_2mnk_flops_in_each_of_its_three_products(rows):
    gemms = [r for r in rows if r["op"] == "gemm" and r["dtype"] == "bf16"]
    assert {r["pass"] for r in gemms} == {"forward", "dgrad", "wgrad"}
    for r in gemms:
        m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
        assert float(r["flops"]) == pytest.approx(2 * m * n * k, rel=1e-5)
        assert float(r["tflops"]) == pytest.approx(2 * m * n * k / float(r["seconds"]) / 1e12,
                                                   rel=1e-4)


def test_causal_attention_counts_half_the_square_and_backward_two_and_a_half_times(rows):
    # FlashAttention-2 (Dao 2023) sec. 4.1: forward 4 s^2 d h per sequence, halved when causal;
    # backward 2.5 times the forward.
    attention = {r["pass"]: r for r in rows if r["op"] == "attention" and not r["error"]}
    fwd, both = attention["forward"], attention["forward+backward"]
    b, h, s, d = (int(fwd[key]) for key in ("batch", "heads", "seq", "head_dim"))
    assert float(fwd["flops"]) == pytest.approx(4 * b * h * s * s * d / 2, rel=1e-5)
    assert float(both["flops"]) == pytest.approx(3.5 * float(fwd["flops"]), rel=1e-5)


def test_a_copy_counts_bytes_read_and_written(rows):
    (copy,) = [r for r in rows if r["op"] == "copy"]
    assert float(copy["bytes"]) == 2 * 2 * (1 << 20)  # 2^20 bf16 values read, then written
    assert float(copy["p10_s"]) <= float(copy["seconds"]) <= float(copy["p90_s"])


def test_the_full_sweep_refuses_a_machine_without_a_gpu(tmp_path, capsys):
    if kernels.torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert kernels.main(["--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: --quick")
