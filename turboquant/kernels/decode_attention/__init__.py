"""Flash-decoding attention for one new token per sequence over a TurboQuant-packed K and V cache.

Cache (per batch row b, KV head h, token t). A stream (keys or values) holds each vector as one or two
*channel groups* ``g`` (the outlier split of the fractional-bit presets: ``m_0`` outlier channels first, then
the other ``m_1``), taken in a per-(b, h) channel order ``P`` (``x_P = x[perm]``; identity without a split).
Group ``g`` of ``x_P`` is quantized on its own, with its own rotation ``Pi_g``, codebook ``c_g`` and norm:

    TurboQuant_mse  (Alg. 1):  x~_g = n_g Pi_g^T c_g[idx_g]
    TurboQuant_prod (Alg. 2):  x~_g = n_g (Pi_g^T c_g[idx_g] + gamma_g rho_g S_g^T z_g),   gamma_g = sqrt(pi/2) / m_g,

with ``idx`` the (b-1)-bit MSE codes for prod (none at 1 bit), ``z = sign(S_g r)`` in {-1, +1}^m the QJL sign bits
of the unit vector's residual ``r`` (``S_g`` acts on the group's unrotated channels, as in ``turboquant.QJL``) and
``rho = ||r||``. So a logit is a sum of *stages*, each a per-token weight times an inner product of a
stage query with a table entry per code:

    s_t = scale * sum_g n_{g,t} ( <Pi_g q_g, c_g[idx_{g,t}]> + rho_{g,t} <gamma_g S_g q_g, z_{g,t}> ),   q_g = (q_P)_g.

Every stage query is a linear map of ``q_P`` (the query in its KV head's key channel order; the GQA group of
query heads shares it): one launch gathers ``q_P`` and multiplies it by the fixed (head_dim, L) matrix
:attr:`CacheFormat.query_map` that stacks ``Pi_g`` and ``gamma_g S_g`` (block-diagonal over the groups, columns
in the kernel's stream order). Keys are never decoded to vectors. Values, with ``p = softmax(s)``:

    o_P = concat_g Pi_g^T ( sum_t p_t n_{g,t} c_g[idx_{g,t}] ),    o[perm_V[j]] = o_P[j],

i.e. each value group is accumulated in its own rotated domain, rotated back once on the (head_dim,) output
(one block-diagonal matrix) and un-permuted to the model's channel order.

A stream's codes are one :class:`turboquant.QuantizedVectors` per channel group (outliers first), leading shape
(batch, kv_heads, tokens), the token axis possibly strided; a quantizer's ``stored`` or
:meth:`ChannelGroup.packed` makes them.

Sequence lengths may differ within the batch (``seq_lens``); tokens at or past a row's length are
never read. No causal mask is needed: the new token attends to every cached token.

The package, one module per job:

=================  ==========================================================================================
``format``         :class:`ChannelGroup`, :class:`CacheFormat` (the stage query map, tables and compile-time
                   geometry, derived once) and the input checks
``kernel``         the Triton kernels: split (tiles, stages, online softmax), merge (the splits) and rotate (the
                   query map before the split, ``Pi_V^T`` after the merge)
``mma``            the register-operand split kernel (Gluon) for the layouts it serves
``launch``         :func:`decode_attention_groups_triton`, :func:`decode_attention_triton` and their defaults
``reference``      the float64 reference over the dequantized cache
=================  ==========================================================================================
"""
from .format import MAX_CHANNEL_GROUPS, CacheFormat, ChannelGroup
from .launch import SplitPlan, decode_attention_groups_triton, decode_attention_triton, split_plan
from .reference import (
    decode_attention_groups_reference,
    decode_attention_reference,
    dequantize_group_reference,
    dequantize_stream_reference,
)

__all__ = [
    "MAX_CHANNEL_GROUPS", "CacheFormat", "ChannelGroup", "SplitPlan", "decode_attention_groups_reference",
    "decode_attention_groups_triton", "decode_attention_reference", "decode_attention_triton",
    "dequantize_group_reference", "dequantize_stream_reference", "split_plan",
]
