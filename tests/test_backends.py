"""The capability table (turboquant.backends): which candidate serves, in what order, and the reasons given."""
import pytest

from turboquant import backends
from turboquant.backends import KernelStream, ann_search_path, decode_read_path, quantizer_backend


def test_quantizer_backend_order_and_reasons(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cpu = quantizer_backend("auto", "cpu", mse_bits=3, dim=128)
    assert cpu.chosen == ("numba" if backends.numba_available() else "torch")
    assert "no Triton kernel runs on cpu" in cpu.why_not("triton")
    assert cpu.why_not("torch") == f"{cpu.chosen} comes first" or cpu.chosen == "torch"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "CUDA devices only" in quantizer_backend("auto", "cpu", mse_bits=3, dim=128).why_not("triton")
    assert cpu.why_not(cpu.chosen) is None
    with pytest.raises(KeyError, match="not a candidate"):
        cpu.why_not("cuda")
    torch_only = quantizer_backend("torch", "cpu", mse_bits=3, dim=128)
    assert torch_only.chosen == "torch" and "not asked for (backend='torch')" in torch_only.why_not("numba")
    assert "torch" in str(torch_only) and "numba" in str(torch_only)
    assert quantizer_backend("triton", "cpu", mse_bits=4, dim=64).chosen == "triton"  # the interpreter
    with pytest.raises(ValueError, match="backend='triton' cannot serve this configuration: the kernels' codes"):
        quantizer_backend("triton", "cpu", mse_bits=5, dim=64)
    with pytest.raises(ValueError, match="dim <= 256, got 512"):
        quantizer_backend("triton", "cpu", mse_bits=3, dim=512, prod=True)
    assert "bits=1" in quantizer_backend("auto", "cpu", mse_bits=0, dim=64, prod=True).why_not("numba")
    with pytest.raises(ValueError, match="backend must be one of"):
        quantizer_backend("gpu", "cpu", mse_bits=2, dim=64)


def test_quantizer_backend_without_triton(monkeypatch):
    real = backends.importlib.util.find_spec
    monkeypatch.setattr(backends.importlib.util, "find_spec",
                        lambda name, *a: None if name == "triton" else real(name, *a))
    assert quantizer_backend("auto", "cuda", mse_bits=2, dim=64).why_not("triton") == "Triton is not installed"
    assert not backends.triton_available("cuda")


def test_ann_search_path():
    assert ann_search_path("dense", "cpu", "torch", [4]).chosen == "dense"
    on_gpu = ann_search_path("lut", "cuda", "torch", [4])
    assert on_gpu.chosen == "device" and "codes on cuda" in on_gpu.why_not("lut")
    assert ann_search_path("dense", "cpu", "triton", [3]).chosen == "device"
    with pytest.raises(ValueError, match="scorer='lut' needs code widths dividing 8, got \\[3\\]"):
        ann_search_path("lut", "cpu", "torch", [3])
    assert ann_search_path("lut", "cpu", "torch", [2, 1]).chosen == "lut"
    auto = ann_search_path("auto", "cpu", "torch", [3])
    assert auto.chosen == "dense"
    assert auto.why_not("fastscan").endswith("prod: 2, 4), got 3") or "needs faiss" in auto.why_not("fastscan")
    with pytest.raises(ValueError, match="scorer must be one of"):
        ann_search_path("flat", "cpu", "torch", [4])


def test_decode_read_path():
    four = [KernelStream("key", "turboquant", 4), KernelStream("value", "turboquant", 4)]
    assert decode_read_path("auto", None, four).chosen == "fused"
    assert decode_read_path(False, None, four).chosen == "workspace"
    assert decode_read_path(False, None, four).why_not("fused") == "not asked for (fused_decode=False)"
    prod = [KernelStream("key", "turboquant", 6, qjl=True), KernelStream("value", "turboquant", 4)]
    assert decode_read_path("auto", None, prod).why_not("fused") == (
        "key_bits=6 (5-bit MSE codes + QJL signs): the decode kernel reads MSE codes of 1-4 bits")
    with pytest.raises(ValueError, match="fused_decode=True cannot serve this configuration: value_format='uniform'"):
        decode_read_path(True, None, [four[0], KernelStream("value", "uniform", 4)])
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match="fused_decode must be one of"):
            decode_read_path(bad, None, four)


def test_the_table():
    table = backends.capability_table("cpu")
    assert "TurboQuantMSE(bits=8)" in table and "TurboQuantProd(bits=2)" in table
    assert "K4/V4 cache              decode read path: fused" in table  # judged by the configuration alone
    assert "K5/V5 cache              decode read path: workspace (fused: key_bits=5" in table
    assert "K4/V4 d=128 kernel       decode kernel: tiles (mma: " in table  # no Gluon kernel runs on a CPU
