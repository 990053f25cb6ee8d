"""The warpgroup-MMA quantize kernel (``turboquant/kernels/quantize_wgmma.py``, Gluon, Hopper only).

Off the GPU: the code and sign steps' PTX (emulated), the lane-level packing the kernel does (accumulator columns in
``code_column_order``, pair registers assembled by shift-adds, 3-bit groups cut into words) recomputed in NumPy
against the library's bit stream, the refusals, and an offline sm_90 compile. On a Hopper GPU: the kernel against
the float64 reference."""
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
    n = 8j + 2t + u, i.e. channels ``code_column_order(bits)[n]``; pair j is one register (u = 1 in the high half);
    word (3 bits: group) w sums pair p << bits p over its pairs j = P w + p; a 3-bit group moves its high codes from
    bit 16 to bit 12, and four groups are cut into three words. Returns the row's int32 words in memory order."""
    order = qw.code_column_order(bits).numpy()
    pairs = qw.pairs_per_word(bits)
    words = {}
    for t in range(4):
        registers = [int(codes_by_channel[order[8 * j + 2 * t]]) | int(codes_by_channel[order[8 * j + 2 * t + 1]]) << 16
                     for j in range(16)]
        slots = [sum(registers[pairs * w + p] << (bits * p) for p in range(pairs)) & 0xFFFFFFFF
                 for w in range(16 // pairs)]
        if bits == 3:
            g0, g1, g2, g3 = [(s & 0xFFF) | ((s >> 4) & 0xFFF000) for s in slots]
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


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_f16x2_codes_are_the_nearest_centroids(bits) -> None:
    """The fp16-pair code step's PTX (emulated, both halves of every register): exactly the midpoint count of the
    fp16-rounded coordinate against the fp16-rounded midpoints, hence the float64 answer except within
    2^-10 |y| + 2^-24 of a midpoint (a tie: fp16 rounding, subnormals flushed near 0), and one level off there."""
    from tests.kernels.test_kernel_prmt import run_ptx

    boundaries = np.asarray(tq.lloyd_max_codebook(128, bits).boundaries, dtype=np.float64)
    table = qw._positive_midpoints(boundaries.tobytes(), "cpu").numpy().view(np.uint32)
    words = {4 + 2 * k: int(w) for k, w in enumerate(table)}
    near = np.concatenate([boundaries * (1 + e) for e in (0.0, 1e-4, -1e-4, 2e-3, -2e-3)])
    y = np.concatenate([np.random.default_rng(bits).normal(0, 0.12, 3000), near,
                        [0.0, -0.0, 1e-30, -1e-30, 1e-6, -1e-6, 0.9, -0.9, 7e4, -7e4]]).astype(np.float32)
    y = np.concatenate([y, y[:1]]) if y.size % 2 else y
    bits32 = y.view(np.uint32)
    program = qw._f16x2_code_asm(bits)
    got = []
    for low, high in zip(bits32[::2], bits32[1::2]):
        out = run_ptx(program, {2: int(low), 3: int(high), **words})
        assert out[1] == out[0]
        got += [out[0] & 0xFFFF, out[0] >> 16]
    got = np.array(got)
    half, y16 = 1 << (bits - 1), y.astype(np.float16).astype(np.float64)
    mids16 = boundaries[half:].astype(np.float16).astype(np.float64)
    j = (np.abs(y16)[:, None] > mids16[None, :]).sum(axis=1)
    assert np.array_equal(got, np.where(y16 > 0, half + j, half - 1 - j))
    want = np.searchsorted(boundaries, y.astype(np.float64), side="left")
    tie = np.abs(y[:, None].astype(np.float64) - boundaries[None, :]).min(axis=1) <= 2.0 ** -10 * np.abs(y) + 2.0 ** -24
    assert np.array_equal(got[~tie], want[~tie]) and (np.abs(got - want) <= 1).all() and tie.sum() < y.size // 10


@pytest.mark.parametrize("bits", [1, 2, 3])
def test_f16x2_residuals_are_y_minus_the_centroid(bits) -> None:
    """The prod kernel's fp16-pair step (PTX emulated): the codes of the plain step, and y - c[code] in float32 with
    the centroid rounded to fp16, chosen by the tree's own masks, for every code and both halves."""
    from tests.kernels.test_kernel_prmt import run_ptx

    codebook = tq.lloyd_max_codebook(128, bits)
    boundaries = np.asarray(codebook.boundaries, dtype=np.float64)
    mids = qw._positive_midpoints(boundaries.tobytes(), "cpu").numpy().view(np.uint32)
    magnitudes = qw._positive_magnitudes(codebook.centroids_tensor()).numpy().view(np.uint32)
    operands = {6 + 2 * k: int(w) for k, w in enumerate(mids)} | {20 + 2 * k: int(w) for k, w in enumerate(magnitudes)}
    y = np.concatenate([np.random.default_rng(bits).normal(0, 0.12, 1000), boundaries * 1.01, boundaries * 0.99,
                        [0.0, -0.0, 0.5, -0.5]]).astype(np.float32)
    bits32 = y.view(np.uint32)
    codes_program, program = qw._f16x2_code_asm(bits), qw._f16x2_code_asm(bits, residuals=True)
    centroids16 = codebook.centroids.astype(np.float16).astype(np.float32)
    for low, high, y0, y1 in zip(bits32[::2], bits32[1::2], y[::2], y[1::2]):
        out = run_ptx(program, {4: int(low), 5: int(high), **operands})
        plain = run_ptx(codes_program, {2: int(low), 3: int(high), **{k - 2: v for k, v in operands.items() if k < 20}})
        assert out[0] == out[1] == plain[0]
        for code, value, residual in ((out[0] & 0xFFFF, y0, out[2]), (out[0] >> 16, y1, out[3])):
            got = np.array([residual], dtype=np.uint32).view(np.float32)[0]
            assert got == np.float32(value - centroids16[code]), (value, code)
            bound = 2.0 ** -11 * abs(codebook.centroids[code]) + 2.0 ** -24
            assert abs(got - (value - codebook.centroids[code])) <= bound


def test_pair_signs_are_z_at_least_zero() -> None:
    """The QJL sign step's PTX (emulated): [z >= 0] of both float32 values of a pair, +0, subnormals and infinities
    included, as a register of two 1-bit codes (the second value's in bit 16)."""
    from tests.kernels.test_kernel_prmt import run_ptx

    z = np.concatenate([np.random.default_rng(0).normal(0, 1, 400), [0.0, 1e-30, -1e-30, 1e-40, -1e-40, 1e6, -1e6,
                                                                     np.inf, -np.inf, 2.5]]).astype(np.float32)
    bits32 = z.view(np.uint32)
    for low, high, z0, z1 in zip(bits32[::2], bits32[1::2], z[::2], z[1::2]):
        out = run_ptx(qw.PAIR_SIGNS.value, {2: int(low), 3: int(high)})
        assert out[0] == out[1] == int(z0 >= 0) | int(z1 >= 0) << 16, (z0, z1)


def test_sketch_operand_gives_the_qjl_signs_in_code_order() -> None:
    """The second product: with the residual e = Pi r in the first accumulator's column order (that of the MSE
    codes' width), e @ B2 holds S r in the column order of 1-bit codes (so its signs pack like them)."""
    gen = torch.Generator().manual_seed(0)
    rotation = tq.make_rotation("haar", 128, seed=1).matrix().double()
    sketch = torch.randn(128, 128, generator=gen, dtype=torch.float64)
    r = torch.randn(5, 128, generator=gen, dtype=torch.float64)
    cols = qw.code_column_order(1)
    for mse_bits in (1, 2, 3):
        rows = qw.code_column_order(mse_bits)
        accumulated = (r @ rotation.T)[:, rows] @ qw._sketch_operand(rotation, sketch, mse_bits).double()
        torch.testing.assert_close(accumulated, (r @ sketch.T)[:, cols], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_each_lane_owns_32_contiguous_channels(bits) -> None:
    """Lane t computes channels 32t .. 32t + 31, and a pair's two codes sit in one word, half a word apart."""
    order = qw.code_column_order(bits).numpy()
    n = np.arange(128)
    lane = (n >> 1) & 3
    assert np.array_equal(np.sort(order), n)
    assert all(np.array_equal(np.sort(order[lane == t]), np.arange(32 * t, 32 * t + 32)) for t in range(4))
    per_word = 8 if bits == 3 else 32 // bits
    assert np.array_equal(order[1::2] - order[::2], np.full(64, per_word // 2))
    assert np.array_equal(order[1::2] // per_word, order[::2] // per_word)


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
    from turboquant.kernels.quantize_prod import quantize_prod_triton

    cb4 = tq.lloyd_max_codebook(128, 4)
    with pytest.raises(ValueError, match="kernel='wgmma' cannot serve"):  # 4-bit MSE codes (and no Gluon on a CPU)
        quantize_prod_triton(x.to(device), torch.eye(128, device=device), cb4.boundaries,
                             cb4.centroids_tensor(device), 4, torch.eye(128, device=device), kernel="wgmma")



@pytest.mark.skipif(not HOPPER, reason="the warpgroup-MMA kernel runs on Hopper GPUs only")
@pytest.mark.parametrize("bits", [2, 3, 4])
def test_bf16_rows_match_reference_on_gpu(bits) -> None:
    """bf16 rows: read from their staged tile into registers, scaled to unit rows and rounded to fp16 there."""
    gen = torch.Generator().manual_seed(bits)
    cb = tq.lloyd_max_codebook(128, bits)
    rotation = tq.make_rotation("haar", 128, seed=5).matrix().cuda()
    x = (3 * torch.randn(5000, 128, generator=gen)).bfloat16().cuda()
    codes, norms = quantize_mse_triton(x, rotation, cb.boundaries, bits)
    assert qw.wgmma_quantize_unsupported(x, bits) is None  # so "auto" ran the wgmma kernel
    ref_codes, ref_norms, y = quantize_mse_reference(x, rotation, cb.boundaries, bits)
    assert_codes_match(codes, ref_codes, y, cb.boundaries, bits, 128)
    torch.testing.assert_close(norms.double(), ref_norms, rtol=1e-6, atol=0)


def test_option_choices() -> None:
    """The tile kernel's options (``nearest``, ``lookup``) are refused by name when the wgmma kernel is asked for;
    a step neither kernel has is refused."""
    from turboquant.kernels.quantize_prod import quantize_prod_triton

    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(8, 128, device=device).half()
    cb = tq.lloyd_max_codebook(128, 4)
    eye = torch.eye(128, device=device)
    for bad in ({"nearest": "table"}, {"nearest": "tree"}, {"lookup": False}):
        with pytest.raises(ValueError, match="one nearest-centroid step"):
            quantize_mse_triton(x, eye, cb.boundaries, 4, kernel="wgmma", **bad)
    cb3 = tq.lloyd_max_codebook(128, 3)
    with pytest.raises(ValueError, match="one nearest-centroid step"):
        quantize_prod_triton(x, eye, cb3.boundaries, cb3.centroids_tensor(device), 3, eye, kernel="wgmma",
                             nearest="tree")
    with pytest.raises(ValueError, match="stages at least 2 tiles"):
        qw._launch(x, eye, cb.boundaries, 4, torch.empty(8, 64, dtype=torch.uint8, device=device),
                   torch.empty(8, device=device), None, 3, 1)
    for step in ("fma", "f16x2"):  # code steps of earlier versions of the wgmma kernel (benchmarks/NOTES.md)
        with pytest.raises(ValueError, match="nearest must be None, 'table' or 'tree'"):
            quantize_mse_triton(x, eye, cb.boundaries, 4, nearest=step)
        with pytest.raises(ValueError, match="nearest must be None, 'table' or 'tree'"):
            quantize_prod_triton(x, eye, cb3.boundaries, cb3.centroids_tensor(device), 3, eye, nearest=step)


def test_offline_compile_for_sm90() -> None:
    """Every width compiles for sm_90 with four HGMMA per tile and no spills; the rows reach the product staged by TMA
    (the loop's only shared-memory accesses the norms' reads of the staged tile, ldmatrix in the accumulator's
    layout), the codes leave the accumulator without shared memory, and the tile loop shortens with the width and
    stays below the rows-through-registers path's (session 36: 929 / 784 / 670 SASS instructions at 4 / 3 / 2 bits,
    168 registers); prod adds a second product."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "benchmarks.compile_offline", "--ops", "quantize"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    header = next(line for line in run.stdout.splitlines() if line.startswith("| launch"))
    keys = [k.strip() for k in header.strip("|").split("|")]
    rows = {row["launch"]: row for row in (dict(zip(keys, (c.strip() for c in line.strip("|").split("|"))))
                                           for line in run.stdout.splitlines() if "quantize_wgmma_kernel" in line)}
    launches = [f"quantize b={b} wgmma" for b in (4, 3, 2, 1)]
    three_stages = "quantize b=4 wgmma 3 stages"
    prod = [f"quantize prod b={b} wgmma" for b in (4, 3, 2)]
    bf16_rows = ["quantize b=4 wgmma bf16 rows", "quantize prod b=4 wgmma bf16 rows"]
    assert list(rows) == launches + [three_stages] + prod + bf16_rows
    for name in launches + [three_stages]:
        row = rows[name]
        assert row["stack"] == "0" and int(row["HGMMA"]) > 0 and int(row["loop shared"]) <= 8, row
        assert int(row["regs"]) <= 168, row  # three programs of one warpgroup per SM
    loops = [int(rows[name]["loop"]) for name in launches]
    assert loops == sorted(loops, reverse=True) and loops[0] < 929, loops
    first = rows[launches[0]]
    for name in prod:  # a second product, its operand (the residual) converted in registers; at 255 registers
        # (Triton 3.6: no spills; 3.9 spills 24 bytes)
        row = rows[name]
        assert int(row["stack"]) <= 64 and int(row["HGMMA"]) == 2 * int(first["HGMMA"]), row
    bf16, bf16_prod = (rows[name] for name in bf16_rows)  # the staged rows as the register operand: fp16's products
    assert bf16["stack"] == "0" and bf16["HGMMA"] == first["HGMMA"] and bf16["shared B"] == first["shared B"], bf16
    assert int(bf16_prod["stack"]) <= 64 and bf16_prod["HGMMA"] == rows[prod[0]]["HGMMA"], bf16_prod


@pytest.mark.skipif(not HOPPER, reason="the warpgroup-MMA kernel runs on Hopper GPUs only")
@pytest.mark.parametrize("bits", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [1, 70, 5000])
@pytest.mark.parametrize("programs_per_sm, num_stages", [(None, None), (2, 3)])
def test_matches_reference_on_gpu(bits, n, programs_per_sm, num_stages) -> None:
    gen = torch.Generator().manual_seed(n + bits)
    cb = tq.lloyd_max_codebook(128, bits)
    rotation = tq.make_rotation("haar", 128, seed=3).matrix().cuda()
    x = (3 * torch.randn(n, 128, generator=gen)).half().cuda()
    x[n // 2] = 0 if n > 1 else x[0]  # a zero row among others
    codes, norms = quantize_mse_triton(x, rotation, cb.boundaries, bits, kernel="wgmma",
                                       programs_per_sm=programs_per_sm, num_stages=num_stages)
    ref_codes, ref_norms, y = quantize_mse_reference(x, rotation, cb.boundaries, bits)
    keep = ref_norms > 0
    assert_codes_match(codes[keep], ref_codes[keep], y[keep], cb.boundaries, bits, 128)
    assert (norms[~keep] == 0).all() and int(keep.sum()) == n - (n > 1)
    torch.testing.assert_close(norms.double(), ref_norms, rtol=1e-6, atol=0)


@pytest.mark.skipif(not HOPPER, reason="the warpgroup-MMA kernel runs on Hopper GPUs only")
def test_rows_tma_cannot_address_are_copied_first() -> None:
    """Rows starting off a 16-byte boundary (TMA's alignment): the codes and norms of the same rows aligned."""
    cb = tq.lloyd_max_codebook(128, 4)
    rotation = tq.make_rotation("haar", 128, seed=1).matrix().cuda()
    x = torch.randn(70 * 128 + 1, device="cuda").half()[1:].view(70, 128)
    assert x.data_ptr() % 16
    got, want = (quantize_mse_triton(rows, rotation, cb.boundaries, 4, kernel="wgmma") for rows in (x, x.clone()))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


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


@pytest.mark.skipif(not HOPPER, reason="the warpgroup-MMA kernel runs on Hopper GPUs only")
@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_prod_matches_reference_on_gpu(bits, dtype) -> None:
    """TurboQuant_prod through the wgmma kernel, fp16 rows and bf16 rows (rounded to fp16 unit rows in registers)."""
    from tests.kernels.test_kernel_quantize_prod import assert_close_off_ties
    from turboquant.kernels.quantize_prod import quantize_prod_reference, quantize_prod_triton

    quantizer = tq.TurboQuantProd(128, bits, rotation="haar", seed=4)
    x = (2 * torch.randn(3000, 128, generator=torch.Generator().manual_seed(bits))).to(dtype)
    mse = quantizer.mse
    args = (mse.rotation.matrix().cuda(), mse.codebook.boundaries, mse.codebook.centroids_tensor("cuda"))
    codes, signs, norms, residual_norms = quantize_prod_triton(x.cuda(), *args, bits - 1,
                                                               quantizer.qjl.matrix.cuda(), kernel="wgmma")
    ref = quantize_prod_reference(x, args[0].cpu(), args[1], args[2].cpu(), bits - 1, quantizer.qjl.matrix)
    gap = (ref["y"][..., None] - torch.as_tensor(mse.codebook.boundaries)).abs().min(dim=-1).values
    assert_close_off_ties(codes, ref["codes"], bits - 1, 128, gap)
    same_rows = (codes.cpu() == ref["codes"]).all(dim=-1)
    margin = ref["sketch"].abs() / ref["residual_norms"][:, None].clamp_min(1e-12)
    assert_close_off_ties(signs[same_rows], ref["signs"][same_rows], 1, 128, margin[same_rows] / 128 ** 0.5)
    torch.testing.assert_close(norms.cpu().double(), ref["norms"], rtol=1e-6, atol=0)
    torch.testing.assert_close(residual_norms.cpu().double()[same_rows], ref["residual_norms"][same_rows],
                               rtol=1e-2, atol=1e-4)


@pytest.mark.skipif(not HOPPER, reason="the warpgroup-MMA kernel runs on Hopper GPUs only")
def test_auto_takes_wgmma_for_fp16_rows() -> None:
    """``kernel="auto"`` on fp16 rows of 128 is the wgmma kernel, MSE and prod alike."""
    from turboquant.kernels.quantize_prod import quantize_prod_triton

    x = torch.randn(500, 128, device="cuda").half()
    rotation = tq.make_rotation("haar", 128, seed=2).matrix().cuda()
    for bits in (3, 4):
        cb = tq.lloyd_max_codebook(128, bits)
        auto = quantize_mse_triton(x, rotation, cb.boundaries, bits)
        chosen = quantize_mse_triton(x, rotation, cb.boundaries, bits, kernel="wgmma")
        assert all(torch.equal(a, c) for a, c in zip(auto, chosen))
    cb = tq.lloyd_max_codebook(128, 2)
    args = (x, rotation, cb.boundaries, cb.centroids_tensor("cuda"), 2, torch.randn(128, 128, device="cuda"))
    auto, chosen = quantize_prod_triton(*args), quantize_prod_triton(*args, kernel="wgmma")
    assert all(torch.equal(a, c) for a, c in zip(auto, chosen))
