"""The warpgroup-MMA quantize kernel (``turboquant/kernels/quantize_wgmma.py``, Gluon, Hopper only).

Off the GPU: the lane-level packing the kernel does (accumulator columns in ``code_column_order``, slots assembled by
shifts and sums, 3-bit groups cut into words) recomputed in NumPy against the library's bit stream, the refusals, and
an offline sm_90 compile. On a Hopper GPU: the kernel against the float64 reference."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import turboquant as tq

pytest.importorskip("triton.experimental.gluon")
from turboquant.kernels import quantize_wgmma as qw  # noqa: E402
from turboquant.kernels.quantize import quantize_mse_reference, quantize_mse_triton  # noqa: E402
from tests.kernels.test_kernel_quantize import assert_codes_match  # noqa: E402

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def _lane_words(codes_by_channel: np.ndarray, bits: int) -> np.ndarray:
    """The words the kernel stores for one row, computed as its lanes do: lane t holds accumulator columns
    n = 8j + 2t + u, i.e. channels ``code_column_order()[n]``; slot k sums code << bits (2 jj + u) over its columns;
    3-bit slots (24-bit groups) are cut into three words. Returns the row's int32 words in memory order."""
    order = qw.code_column_order().numpy()
    pairs = 4 if bits == 3 else 16 // bits
    words = {}
    for t in range(4):
        slots = []
        for k in range(16 // pairs):
            total = 0
            for jj in range(pairs):
                for u in range(2):
                    n = 8 * (k * pairs + jj) + 2 * t + u
                    total += int(codes_by_channel[order[n]]) << (bits * (2 * jj + u))
            slots.append(total)
        if bits == 3:
            g0, g1, g2, g3 = slots
            slots = [(g0 | (g1 << 24)) & 0xFFFFFFFF, (g1 >> 8) | ((g2 << 16) & 0xFFFFFFFF),
                     (g2 >> 16) | ((g3 << 8) & 0xFFFFFFFF)]
        for k, word in enumerate(slots):
            words[bits * t + k] = word
    return np.array([words[i] for i in range(4 * bits)], dtype=np.uint32)


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_lane_packing_is_the_library_bit_stream(bits) -> None:
    gen = torch.Generator().manual_seed(bits)
    for _ in range(3):
        codes = torch.randint(0, 2 ** bits, (128,), generator=gen)
        packed = tq.pack_codes(codes, bits).numpy()
        assert np.array_equal(_lane_words(codes.numpy(), bits).view(np.uint8), packed)


def test_each_lane_owns_32_contiguous_channels() -> None:
    order = qw.code_column_order().numpy()
    n = np.arange(128)
    lane = (n >> 1) & 3
    assert np.array_equal(np.sort(order), n)
    assert all(np.array_equal(np.sort(order[lane == t]), np.arange(32 * t, 32 * t + 32)) for t in range(4))


def test_refusals() -> None:
    x = torch.zeros(4, 128, dtype=torch.float16)
    assert "float16" in qw.wgmma_quantize_unsupported(x.float(), 4)
    assert "128 channels" in qw.wgmma_quantize_unsupported(x[:, :64], 4)
    assert "1-4-bit" in qw.wgmma_quantize_unsupported(x, 5)
    assert "Hopper" in qw.wgmma_quantize_unsupported(x, 4)  # not on the CPU
    from turboquant.backends import quantize_kernel

    assert quantize_kernel("auto", None, None).chosen == "wgmma"  # the rows alone
    assert quantize_kernel("auto", None, "float32 rows").chosen == "tiles"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cb = tq.lloyd_max_codebook(128, 4)
    with pytest.raises(ValueError, match="kernel='wgmma' cannot serve"):  # float32 rows (and no Gluon on a CPU)
        quantize_mse_triton(x.float().to(device), torch.eye(128, device=device), cb.boundaries, 4, kernel="wgmma")
    with pytest.raises(ValueError, match="symmetric"):
        qw._positive_midpoints(np.array([-0.5, 0.1, 0.6]).tobytes(), "cpu")


def test_offline_compile_for_sm90() -> None:
    """Every width compiles for sm_90 with four HGMMA per tile and no spills; the codes leave the accumulator
    without shared memory (the only shared stores: the rotation once, the unit rows' operand conversion)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "benchmarks.compile_offline", "--ops", "quantize"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    header = next(line for line in run.stdout.splitlines() if line.startswith("| launch"))
    keys = [k.strip() for k in header.strip("|").split("|")]
    rows = [dict(zip(keys, (c.strip() for c in line.strip("|").split("|")))) for line in run.stdout.splitlines()
            if "quantize_wgmma_kernel" in line]
    assert [row["launch"] for row in rows] == [f"quantize b={b} wgmma" for b in (4, 3, 2, 1)]
    for row in rows:
        assert row["stack"] == "0" and int(row["HGMMA"]) > 0 and int(row["STS"]) <= 24, row


@pytest.mark.skipif(not HOPPER, reason="the warpgroup-MMA kernel runs on Hopper GPUs only")
@pytest.mark.parametrize("bits", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [1, 70, 5000])
def test_matches_reference_on_gpu(bits, n) -> None:
    gen = torch.Generator().manual_seed(n + bits)
    cb = tq.lloyd_max_codebook(128, bits)
    rotation = tq.make_rotation("haar", 128, seed=3).matrix().cuda()
    x = (3 * torch.randn(n, 128, generator=gen)).half().cuda()
    x[n // 2] = 0 if n > 1 else x[0]  # a zero row among others
    codes, norms = quantize_mse_triton(x, rotation, cb.boundaries, bits, kernel="wgmma")
    ref_codes, ref_norms, y = quantize_mse_reference(x, rotation, cb.boundaries, bits)
    keep = ref_norms > 0
    assert_codes_match(codes[keep], ref_codes[keep], y[keep], cb.boundaries, bits, 128)
    assert (norms[~keep] == 0).all() and int(keep.sum()) == n - (n > 1)
    torch.testing.assert_close(norms.double(), ref_norms, rtol=1e-6, atol=0)


@pytest.mark.skipif(not HOPPER, reason="the warpgroup-MMA kernel runs on Hopper GPUs only")
def test_replays_in_a_cuda_graph() -> None:
    cb = tq.lloyd_max_codebook(128, 4)
    rotation = tq.make_rotation("haar", 128, seed=0).matrix().cuda()
    x = torch.randn(3, 40, 128, device="cuda").half()
    quantize_mse_triton(x, rotation, cb.boundaries, 4, kernel="wgmma")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        codes, norms = quantize_mse_triton(x, rotation, cb.boundaries, 4, kernel="wgmma")
    x.normal_()
    graph.replay()
    want = quantize_mse_triton(x, rotation, cb.boundaries, 4, kernel="wgmma")
    assert torch.equal(codes, want[0]) and torch.equal(norms, want[1])
