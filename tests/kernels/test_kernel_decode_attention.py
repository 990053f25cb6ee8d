"""Split-KV decode attention over a packed cache against float64 attention over the dequantized cache."""
import pytest
import torch

import turboquant as tq
from turboquant.kernels.decode_attention import (
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
        decode_attention_triton(*tensors, seq_lens, **{**common, "k_bits": 3})


def test_log_sum_exp_matches_reference(device, generator):
    """return_lse gives log sum_t exp(scale <q, k~_t>) per (row, head): what an exact merge with other tokens needs."""
    from turboquant.kernels.decode_attention import dequantize_cache_reference

    tensors, common = make_case(2, 8, 2, 70, 64, 4, 3, generator, device, q_dtype=torch.float32)
    seq_lens = torch.tensor([70, 0], dtype=torch.int32, device=device)
    out, lse = decode_attention_triton(*tensors, seq_lens, num_splits=3, block_n=16, return_lse=True, **common)
    keys = dequantize_cache_reference(tensors[1], tensors[2], common["k_centroids"], 4, common["rotation"], 64)
    logits = torch.einsum("hd,htd->ht", tensors[0][0].double(), keys[0].repeat_interleave(4, dim=0)) / 8.0
    assert torch.allclose(lse[0].double(), torch.logsumexp(logits, dim=-1), atol=2e-3, rtol=0)
    assert torch.isneginf(lse[1]).all() and torch.equal(out[1], torch.zeros_like(out[1]))
