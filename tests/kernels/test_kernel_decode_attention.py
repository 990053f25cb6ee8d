"""Split-KV decode attention over a packed cache against float64 attention over the dequantized cache."""
import math

import pytest
import torch

import turboquant as tq
from turboquant.kernels.decode_attention import (
    CacheFormat,
    ChannelGroup,
    decode_attention_groups_reference,
    decode_attention_groups_triton,
    decode_attention_reference,
    decode_attention_triton,
)


def make_case(batch, heads, kv_heads, tokens, dim, k_bits, v_bits, generator, device, q_dtype=torch.bfloat16):
    def cache(bits, scale):
        codes = tq.pack_codes(torch.randint(0, 2 ** bits, (batch, kv_heads, tokens, dim), generator=generator), bits)
        norms = (torch.rand(batch, kv_heads, tokens, generator=generator) * scale + 0.1).to(torch.float16)
        return codes.to(device), norms.to(device)

    k_codes, k_norms = cache(k_bits, 20.0)
    v_codes, v_norms = cache(v_bits, 3.0)
    q = torch.randn(batch, heads, dim, generator=generator).to(q_dtype).to(device)
    common = {"k_centroids": tq.lloyd_max_codebook(dim, k_bits).centroids_tensor(device),
                  "v_centroids": tq.lloyd_max_codebook(dim, v_bits).centroids_tensor(device),
                  "k_bits": k_bits, "v_bits": v_bits,
                  "rotation": tq.make_rotation("haar", dim, seed=5).matrix().to(device)}
    return (q, k_codes, k_norms, v_codes, v_norms), common


def rel_err(out, ref):
    return float((out.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("batch, heads, kv_heads, tokens, dim, k_bits, v_bits, lens, splits", [
    (2, 8, 2, 150, 128, 4, 4, [150, 37], 3),    # GQA 4, ragged lengths, partial tiles
    (3, 6, 3, 90, 64, 3, 4, [1, 90, 64], 2),     # 3-bit keys, a one-token row
    (2, 8, 2, 70, 128, 3, 3, [70, 33], 2),       # 3-bit K/V, 16 groups: whole group words (three_bit_group_values)
    (1, 4, 4, 33, 40, 2, 3, [33], 1),            # MHA, generic (stream-order) value path, one split
])
def test_matches_reference(device, generator, batch, heads, kv_heads, tokens, dim, k_bits, v_bits, lens, splits):
    tensors, common = make_case(batch, heads, kv_heads, tokens, dim, k_bits, v_bits, generator, device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    out = decode_attention_triton(*tensors, seq_lens, num_splits=splits, block_n=32, **common)
    ref = decode_attention_reference(*tensors, seq_lens, **common)
    assert out.shape == tensors[0].shape and out.dtype == tensors[0].dtype
    assert rel_err(out, ref) < 1e-2  # bf16 output


def test_empty_row_float32_and_separate_value_rotation(device, generator):
    """A row with no cached tokens gives zeros; fp32 queries keep fp32 accuracy; Pi_V may differ from Pi_K."""
    tensors, common = make_case(2, 4, 2, 40, 64, 4, 4, generator, device, q_dtype=torch.float32)
    common["v_rotation"] = tq.make_rotation("hadamard", 64, seed=9).matrix().to(device)
    seq_lens = torch.tensor([0, 40], dtype=torch.int32, device=device)
    out = decode_attention_triton(*tensors, seq_lens, num_splits=2, block_n=16, **common)
    ref = decode_attention_reference(*tensors, seq_lens, **common)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert rel_err(out[1], ref[1]) < 3e-3


def test_bad_inputs_raise(device, generator):
    tensors, common = make_case(1, 6, 4, 8, 32, 4, 4, generator, device)
    seq_lens = torch.tensor([8], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        decode_attention_triton(*tensors, seq_lens, **common)
    tensors, common = make_case(1, 4, 2, 8, 32, 4, 4, generator, device)
    with pytest.raises(ValueError, match="seq_lens"):
        decode_attention_triton(*tensors, seq_lens.float(), **common)
    with pytest.raises(ValueError, match="bytes"):
        decode_attention_triton(*tensors, seq_lens, **{**common, "k_bits": 3,
                                                       "k_centroids": tq.lloyd_max_codebook(32, 3).centroids_tensor()})


def test_log_sum_exp_matches_reference(device, generator):
    """return_lse gives log sum_t exp(scale <q, k~_t>) per (row, head): what an exact merge with other tokens needs."""
    from turboquant.kernels.decode_attention import dequantize_group_reference

    tensors, common = make_case(2, 8, 2, 70, 64, 4, 3, generator, device, q_dtype=torch.float32)
    seq_lens = torch.tensor([70, 0], dtype=torch.int32, device=device)
    out, lse = decode_attention_triton(*tensors, seq_lens, num_splits=3, block_n=16, return_lse=True, **common)
    group = ChannelGroup(64, 4, common["rotation"], common["k_centroids"])
    keys = dequantize_group_reference(group.packed(tensors[1], tensors[2]), group)
    logits = torch.einsum("hd,htd->ht", tensors[0][0].double(), keys[0].repeat_interleave(4, dim=0)) / 8.0
    assert torch.allclose(lse[0].double(), torch.logsumexp(logits, dim=-1), atol=2e-3, rtol=0)
    assert torch.isneginf(lse[1]).all() and torch.equal(out[1], torch.zeros_like(out[1]))


# ------------------------------------------------------------------------------- channel groups (split, prod)
def random_stream(batch, kv_heads, tokens, groups, generator, device, seed):
    """Random packed codes and the ChannelGroup of each ``(dim, bits, qjl)``: uniform codes and sign bits,
    norms in (0.1, 10.1), residual norms in (0, 1); Haar rotations, Lloyd-Max codebooks, Gaussian sketches."""
    fields, formats = [], []
    for part, (dim, bits, qjl) in enumerate(groups):
        lead = (batch, kv_heads, tokens)
        codes = tq.pack_codes(torch.randint(0, 2 ** max(bits, 1), (*lead, dim), generator=generator), bits) \
            if bits else torch.empty(*lead, 0, dtype=torch.uint8)
        norms = (torch.rand(*lead, generator=generator) * 10 + 0.1).to(torch.float16)
        signs = tq.pack_codes(torch.randint(0, 2, (*lead, dim), generator=generator), 1) if qjl else None
        residual = torch.rand(*lead, generator=generator).to(torch.float16) if qjl else None
        formats.append(ChannelGroup(
            dim, bits, tq.make_rotation("haar", dim, seed=seed + part).matrix().to(device) if bits else None,
            tq.lloyd_max_codebook(dim, bits).centroids_tensor(device) if bits else None,
            torch.randn(dim, dim, generator=generator).to(device) if qjl else None,
            math.sqrt(math.pi / 2) / dim if qjl else None))
        fields.append(formats[-1].packed(*(None if t is None else t.to(device)
                                           for t in (codes, norms, signs, residual))))
    return fields, formats


def random_permutation(batch, kv_heads, dim, generator, device):
    return torch.rand(batch, kv_heads, dim, generator=generator).argsort(dim=-1).to(device)


@pytest.mark.parametrize("heads, kv_heads, lens, key_groups, value_groups, permute", [
    # the 3.5-bit preset at head_dim 64: 16 outlier channels at 4 bits, 48 (not a power of two) at 3, K and V
    (8, 2, [61, 23], [(16, 4, False), (48, 3, False)], [(16, 4), (48, 3)], True),
    # TurboQuant_prod keys, one group: 3-bit MSE + QJL of the residual
    (4, 2, [40, 1], [(64, 3, True)], [(64, 4)], False),
    # 3.5-bit prod keys (split + QJL on both groups), an empty row, three splits
    (6, 3, [0, 50, 33], [(16, 3, True), (48, 2, True)], [(16, 4), (48, 3)], True),
    # odd group dims (partial code groups and sign bytes), QJL alone on the second group (prod at 1 bit), MHA
    (3, 3, [37], [(10, 3, True), (30, 0, True)], [(10, 2), (30, 4)], True),
    # fewer codes than one tl.dot's 16 columns (6 channels: 2 groups of 2-bit codes, 1 byte of sign bits), 1-bit MSE
    (4, 1, [19, 26], [(6, 2, True), (26, 1, False)], [(6, 3), (26, 2)], True),
    # keys split, values not (value_outliers=False), a GQA group of 8
    (16, 2, [29, 17], [(12, 4, False), (36, 3, False)], [(48, 2)], True),
])
def test_channel_groups_match_reference(device, generator, heads, kv_heads, lens, key_groups, value_groups, permute):
    batch, tokens, dim = len(lens), max(lens), sum(g[0] for g in key_groups)
    keys, key_format = random_stream(batch, kv_heads, tokens, key_groups, generator, device, seed=3)
    values, value_format = random_stream(batch, kv_heads, tokens, [(m, b, False) for m, b in value_groups],
                                         generator, device, seed=7)
    cache_format = CacheFormat.build(key_format, value_format, device)
    perms = {"key_permutation": random_permutation(batch, kv_heads, dim, generator, device) if permute else None,
             "value_permutation": (random_permutation(batch, kv_heads, dim, generator, device)
                                   if permute and len(value_groups) == 2 else None)}
    q = torch.randn(batch, heads, dim, generator=generator).to(device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    out, lse = decode_attention_groups_triton(q, keys, values, seq_lens, cache_format, num_splits=3, block_n=16,
                                              return_lse=True, **perms)
    ref, ref_lse = decode_attention_groups_reference(q, keys, values, seq_lens, cache_format, return_lse=True,
                                                     **perms)
    filled = seq_lens > 0
    assert rel_err(out[filled], ref[filled]) < 3e-3  # fp16 operands, fp32 accumulation and output
    assert torch.allclose(lse[filled].double(), ref_lse[filled], atol=5e-3, rtol=0)
    assert torch.equal(out[~filled], torch.zeros_like(out[~filled])) and torch.isneginf(lse[~filled]).all()


def test_reference_dequantizes_as_the_library(device, generator):
    """The reference's TurboQuant_prod group, n (Pi^T c[idx] + sqrt(pi/2)/m rho S^T z), is the library's dequantize."""
    from turboquant.kernels.decode_attention import dequantize_group_reference

    quantizer = tq.TurboQuantProd(24, 3, seed=11)
    x = torch.randn(2, 3, 5, 24, generator=generator) * 4
    qv = quantizer.quantize(x)
    group = ChannelGroup(24, 2, quantizer.rotation.matrix(), quantizer.codebook.centroids_tensor(),
                         quantizer.qjl.matrix, quantizer.qjl.scale)
    assert group.qjl_scale == math.sqrt(math.pi / 2) / 24
    got = dequantize_group_reference(qv, group)
    assert torch.allclose(got.float(), quantizer.dequantize(qv), atol=1e-5, rtol=1e-5)


def test_channel_group_formats_are_checked(device, generator):
    rot = tq.make_rotation("haar", 16, seed=0).matrix()
    with pytest.raises(ValueError, match="1-4 bits"):
        ChannelGroup(16, 5, rot, torch.zeros(32))
    with pytest.raises(ValueError, match="needs a QJL sketch"):
        ChannelGroup(16, 0)
    with pytest.raises(ValueError, match="centroids"):
        ChannelGroup(16, 2, rot, torch.zeros(8))
    group = ChannelGroup(16, 2, rot, torch.zeros(4))
    with pytest.raises(ValueError, match="no QJL stage"):
        CacheFormat.build([group], [ChannelGroup(16, 2, rot, torch.zeros(4), torch.eye(16), 1.0)], device)
    with pytest.raises(ValueError, match="qjl_scale"):
        ChannelGroup(16, 2, rot, torch.zeros(4), torch.eye(16))
    with pytest.raises(ValueError, match="channels"):
        CacheFormat.build([group, group], [group], device)
    keys, _ = random_stream(1, 2, 8, [(16, 2, True)], generator, device, seed=0)
    with pytest.raises(ValueError, match="QJL signs"):  # the format has no sketch, the fields have signs
        decode_attention_groups_triton(torch.randn(1, 2, 16, device=device), keys, keys,
                                       torch.tensor([8], device=device), CacheFormat.build([group], [group], device))
    three_bit, _ = random_stream(1, 2, 8, [(16, 3, False)], generator, device, seed=0)
    q, lens, two_bit = torch.randn(1, 2, 16, device=device), torch.tensor([8], device=device), \
        CacheFormat.build([group], [group], device)
    with pytest.raises(ValueError, match="3-bit MSE codes for a group of dim 16 with 2"):
        decode_attention_groups_triton(q, three_bit, three_bit, lens, two_bit)
    plain = [(k.codes, k.norms) for k in three_bit]
    with pytest.raises(ValueError, match="expected QuantizedVectors, got tuple"):
        decode_attention_groups_triton(q, plain, plain, lens, two_bit)


# ------------------------------------------------------------------ inner-loop variants (decoder, inner)
@pytest.mark.parametrize("decoder, inner", [("select", "dot"), ("table", "fma"), ("select", "fma")])
@pytest.mark.parametrize("key_groups, value_groups, heads", [
    ([(64, 4, False)], [(64, 4)], 8),                                  # 4-bit K/V, one group: the byte-pair path
    ([(16, 4, False), (48, 3, False)], [(16, 2), (48, 3)], 6),         # split, 2/3-bit values (stream-order path)
    ([(16, 3, True), (48, 2, True)], [(64, 1)], 4),                    # prod keys on both groups, 1-bit values
])
def test_inner_loop_variants_match_reference(device, generator, decoder, inner, key_groups, value_groups, heads):
    """The register codebook (sign + magnitude select tree) and the CUDA-core FMA inner loop compute the same
    attention as the float64 reference, for every layout the one kernel body serves."""
    lens, kv_heads = [37, 20], 2
    batch, dim = len(lens), sum(g[0] for g in key_groups)
    keys, key_format = random_stream(batch, kv_heads, max(lens), key_groups, generator, device, seed=3)
    values, value_format = random_stream(batch, kv_heads, max(lens), [(m, b, False) for m, b in value_groups],
                                         generator, device, seed=7)
    cache_format = CacheFormat.build(key_format, value_format, device)
    perm = random_permutation(batch, kv_heads, dim, generator, device) if len(key_groups) == 2 else None
    q = torch.randn(batch, heads, dim, generator=generator).to(device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    out = decode_attention_groups_triton(q, keys, values, seq_lens, cache_format, num_splits=2, block_n=16,
                                         key_permutation=perm, decoder=decoder, inner=inner)
    ref = decode_attention_groups_reference(q, keys, values, seq_lens, cache_format, key_permutation=perm)
    assert rel_err(out, ref) < 3e-3


def test_register_decoder_check_under_inference_mode(device, generator):
    """Generation runs under ``torch.inference_mode``, whose tensors have no version counter: the codebook check
    the register decoders make must still answer (it raised there in session 9's first H200 hold)."""
    with torch.inference_mode():
        tensors, common = make_case(1, 4, 2, 8, 32, 2, 2, generator, device)
        seq_lens = torch.tensor([8], dtype=torch.int32, device=device)
        out = decode_attention_triton(*tensors, seq_lens, decoder="select", **common)
        ref = decode_attention_triton(*tensors, seq_lens, decoder="table", **common)
    assert rel_err(out, ref) < 1e-3


@pytest.mark.parametrize("block_n", [16, 64, 128])
def test_three_bit_tiles_match_reference_at_every_tile_size(device, generator, block_n):
    """3-bit keys of 128 channels and a 96-channel 3-bit value group decode in channel order in tiles of 64 tokens
    or more and per code position below (``CHANNEL_ORDER_MIN_TOKENS``); both paths give the reference's output.
    On the H200 the channel-order tile at 16 tokens was wrong (relative error ~1) with every decoder."""
    lens = [150, 77]
    keys, key_format = random_stream(2, 2, max(lens), [(128, 3, False)], generator, device, seed=3)
    values, value_format = random_stream(2, 2, max(lens), [(32, 4, False), (96, 3, False)], generator, device, seed=7)
    cache_format = CacheFormat.build(key_format, value_format, device)
    perms = {"key_permutation": random_permutation(2, 2, 128, generator, device),
             "value_permutation": random_permutation(2, 2, 128, generator, device)}
    q = torch.randn(2, 8, 128, generator=generator).to(device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    out = decode_attention_groups_triton(q, keys, values, seq_lens, cache_format, num_splits=2, block_n=block_n,
                                         **perms)
    ref = decode_attention_groups_reference(q, keys, values, seq_lens, cache_format, **perms)
    assert rel_err(out, ref) < 3e-3


def test_register_decoder_needs_a_symmetric_codebook(device, generator):
    tensors, common = make_case(1, 4, 2, 8, 32, 2, 2, generator, device)
    seq_lens = torch.tensor([8], dtype=torch.int32, device=device)
    skewed = {**common, "k_centroids": torch.tensor([-0.2, -0.05, 0.05, 0.3], device=device)}
    decode_attention_triton(*tensors, seq_lens, decoder="table", **skewed)  # the gather takes any codebook
    with pytest.raises(ValueError, match="symmetric"):
        decode_attention_triton(*tensors, seq_lens, decoder="select", **skewed)
    with pytest.raises(ValueError, match="decoder must be"):
        decode_attention_triton(*tensors, seq_lens, decoder="gather", **common)
    if device.type != "cuda":  # "lut" is the register-operand kernel's decoder, which runs on a GPU only
        with pytest.raises(ValueError, match="kernel='mma' cannot serve"):
            decode_attention_triton(*tensors, seq_lens, decoder="lut", **common)
    with pytest.raises(ValueError, match="inner must be"):
        decode_attention_triton(*tensors, seq_lens, inner="wgmma", **common)


@pytest.mark.parametrize("group, n_splits", [(4, 70), (1, 3), (16, 33)])
def test_merge_rotates_back_any_split_count(device, generator, group, n_splits):
    """The merge over more splits than one pass of its tile holds, where the splits without tokens (lse = -inf) hold
    NaN rows (weight 0 must select them away, not multiply them), then the rotation back and the value order's
    scatter, against float64."""
    from turboquant.kernels.decode_attention.launch import _combine

    batch, kv_heads, dim = 2, 3, 128
    heads = group * kv_heads
    part_out = torch.randn(batch, heads, n_splits, dim, generator=generator)
    part_lse = torch.randn(batch, heads, n_splits, generator=generator) * 4
    empty = torch.rand(batch, heads, n_splits, generator=generator) < 0.3
    empty[0, 0] = True  # a head without any token: output 0, lse -inf
    part_lse[empty] = float("-inf")
    part_out[empty] = float("nan")
    rotation = tq.make_rotation("haar", dim, seed=3).matrix()
    group_format = ChannelGroup(dim, 4, rotation.to(device), tq.lloyd_max_codebook(dim, 4).centroids_tensor(device),
                                None, None)
    cache_format = CacheFormat.build([group_format], [group_format], device)
    perm = random_permutation(batch, kv_heads, dim, generator, device)
    out, lse = _combine(part_out.to(device), part_lse.to(device), cache_format, perm, torch.float32, group, True)

    weight = torch.exp2(part_lse.double() - part_lse.double().amax(-1, keepdim=True).clamp_min(-1e300))
    merged = ((weight[..., None] * part_out.double().nan_to_num()).sum(2)
              / weight.sum(-1, keepdim=True).clamp_min(1e-300))
    rotated = merged @ rotation.double()
    expected = torch.empty_like(rotated)
    expected.scatter_(-1, perm.cpu().repeat_interleave(group, dim=1), rotated)
    assert torch.allclose(out.cpu().double(), expected, atol=1e-5)
    expected_lse = torch.logsumexp(part_lse.double() * math.log(2), dim=-1)
    assert torch.equal(torch.isinf(lse.cpu()), torch.isinf(expected_lse))
    finite = torch.isfinite(expected_lse)
    assert torch.allclose(lse.cpu().double()[finite], expected_lse[finite], atol=1e-5)
    assert torch.all(out.cpu()[0, 0] == 0)


@pytest.mark.parametrize("max_tokens, num_splits, block_n",
                         [(1000, None, None), (1000, 3, 64), (70, 8, 32), (0, None, None)])
def test_split_plan_covers_the_tokens_with_whole_tiles(device, max_tokens, num_splits, block_n):
    """``split_plan``: the kernel ``kernel="auto"`` runs here (the register-operand one only on a CUDA GPU for this
    4-bit one-group cache; the tile kernel whenever a tile option is asked for), and splits of whole tiles that cover
    every token, the last one non-empty."""
    from turboquant.kernels.decode_attention import split_plan

    group = [ChannelGroup(128, 4, tq.make_rotation("haar", 128, seed=0).matrix().to(device),
                          tq.lloyd_max_codebook(128, 4).centroids_tensor(device))]
    cache_format = CacheFormat.build(group, group, device)
    plan = split_plan(cache_format, 2, 8, 2, max_tokens, torch.device(device), num_splits=num_splits, block_n=block_n)
    assert plan.kernel == ("mma" if torch.device(device).type == "cuda" else "tiles")
    assert split_plan(cache_format, 2, 8, 2, max_tokens, torch.device(device), decoder="table").kernel == "tiles"
    assert plan.tokens_per_split % plan.block_n == 0 and plan.num_splits >= 1
    if max_tokens:
        assert plan.num_splits * plan.tokens_per_split >= max_tokens > (plan.num_splits - 1) * plan.tokens_per_split
        assert num_splits is None or plan.num_splits <= num_splits
