"""The register-operand decode kernel (``decode_attention.mma``) off the GPU: its PTX decoders run by the emulator of
``test_kernel_prmt``, the channel orders its tile permutations produce, its refusals, and an offline sm_90 compile.

Gluon has no interpreter, so the kernel itself runs only on a GPU (the benchmark checks it against the float64
reference before timing it; ``tests/kernels`` on the device runs :func:`test_mma_kernel_matches_reference_on_gpu`).
What can be checked here is each piece whose mistake would give a wrong answer rather than a compile error: that
the programs decode every code, that the joins and permutes of the decoded tiles put rotated channel
``key_channel_order[k]`` at reduction position k (and ``value_channel_order[m]`` at output row m), and that the
compiler accepts the decoded tiles as MMA operands without moving them (``assert_trivial``)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import turboquant as tq

pytest.importorskip("triton.experimental.gluon")

from turboquant.kernels._decode import (  # noqa: E402
    PAIR_LUT4,
    PAIR_LUT_COPIES,
    PAIR_LUT_FILL,
    PAIR_LUT_SYMBOL,
    PRMT_PAIR3,
    PRMT_PAIR4,
    PRMT_PAIR_MIXED,
    pair_lut_table,
    prmt_byte_tables,
)
from turboquant.kernels import _mma  # noqa: E402
from turboquant.kernels.decode_attention import CacheFormat, ChannelGroup  # noqa: E402

from tests.kernels.test_kernel_prmt import SharedMemory, _byte_tables, _fp16_bits, run_ptx  # noqa: E402


def _table(dim: int = 128) -> np.ndarray:
    return tq.lloyd_max_codebook(dim, 4).centroids_tensor().numpy().astype(np.float16)


def _words(seed: int, n: int = 300) -> list[int]:
    rng = np.random.default_rng(seed)
    every = [sum(((c + k) % 16) << (4 * k) for k in range(8)) for c in range(16)]  # every code at every position
    return every + [int(w) for w in rng.integers(0, 2 ** 32, size=n, dtype=np.uint64)] + [0, 2 ** 32 - 1]


def _signed(values) -> tuple[int, ...]:
    return tuple(v - (1 << 32) if v >= 1 << 31 else v for v in values)


def test_host_byte_tables_are_the_device_ones() -> None:
    table = _table()
    assert prmt_byte_tables(torch.from_numpy(table)) == _signed(_byte_tables(table[8:]))  # 4 bits: magnitudes
    table3 = tq.lloyd_max_codebook(128, 3).centroids_tensor().numpy().astype(np.float16)
    assert prmt_byte_tables(torch.from_numpy(table3)) == _signed(_byte_tables(table3))  # 3 bits: the signed table
    with pytest.raises(ValueError, match="3- or 4-bit codebooks"):
        prmt_byte_tables(torch.zeros(4))


@pytest.mark.parametrize("dim", [64, 128])
def test_pair3_program_decodes_every_code_of_both_groups(dim) -> None:
    """Whatever bits 24-31 of a group word hold (the split streams' 3-bit slots leave them set)."""
    table = tq.lloyd_max_codebook(dim, 3).centroids_tensor().numpy().astype(np.float16)
    lo0, lo1, hi0, hi1 = _byte_tables(table)
    expected = _fp16_bits(table)
    rng = np.random.default_rng(dim)
    groups = [sum(((c + k) % 8) << (3 * k) for k in range(8)) for c in range(8)]  # every code at every position
    groups += [int(g) for g in rng.integers(0, 2 ** 24, size=300)] + [0, 2 ** 24 - 1]
    groups += [g | int(top) << 24 for g, top in zip(groups, rng.integers(1, 256, size=len(groups)))]  # bits 24-31 set
    for a, b in zip(groups, reversed(groups)):
        out = run_ptx(PRMT_PAIR3.value, {8: a, 9: b, 10: lo0, 11: lo0, 12: lo1, 13: lo1, 14: hi0, 15: hi0,
                                         16: hi1, 17: hi1})
        for c in range(8):
            assert out[c] == expected[(a >> (3 * c)) & 7] | expected[(b >> (3 * c)) & 7] << 16, (hex(a), hex(b), c)


def _row_bits(row: np.ndarray, start: int, count: int) -> int:
    """Bits ``start .. start + count - 1`` of a little-endian byte row, as an int."""
    return (int.from_bytes(row.tobytes(), "little") >> start) & ((1 << count) - 1)


def test_three_bit_slots_are_the_groups_of_the_row() -> None:
    """What ``_mma.key_slots`` / ``value_slots`` compute from the words they load (the same formulas, in NumPy) holds
    in bits 0-23 the 24-bit group of the slot's 8 channels (bits 24-31 are left as they fall: ``PRMT_PAIR3`` does not
    read them): key slot 4t + i = channels 32t + 8i.., value slot 2g + w = 16g + 8w.."""
    rng = np.random.default_rng(3)
    for row in rng.integers(0, 256, size=(50, 48), dtype=np.uint8):
        words = row.view("<u4").astype(np.uint64)  # the 12 words of a 3-bit row of 128 channels
        for t in range(4):  # key_slots: lane t loads words 3t .. 3t + 2
            w0, w1, w2 = (int(words[3 * t + i]) for i in range(3))
            slots = [w0, (w0 >> 24) | (w1 << 8), (w1 >> 16) | (w2 << 16), w2 >> 8]
            for i, slot in enumerate(slots):
                assert slot & 0xFFFFFF == _row_bits(row, 3 * (32 * t + 8 * i), 24)
        for g in range(8):  # value_slots: lane g loads words floor(3g / 2) and the next
            first = 3 * (g >> 1) + (g & 1)
            both = int(words[first]) | (int(words[first + 1]) << 32) if first + 1 < 12 else int(words[first])
            offset = 16 * (g & 1)
            for w in range(2):
                slot = (both >> (offset + 24 * w)) & 0xFFFFFFFF  # the uint32 the slot keeps
                assert slot & 0xFFFFFF == _row_bits(row, 3 * (16 * g + 8 * w), 24)


def _lane_coordinates(layout, lane: int) -> list[tuple[int, int]]:
    """(token, slot) of each register of ``lane`` in a one-warp linear layout (XOR of the bases of its set bits)."""
    def at(bases, index):
        point = [0, 0]
        for bit, basis in enumerate(bases):
            if index >> bit & 1:
                point = [p ^ b for p, b in zip(point, basis)]
        return point
    lane_point = at(layout.lane_bases, lane)
    return [tuple(p ^ q for p, q in zip(lane_point, at(layout.reg_bases, j)))
            for j in range(1 << len(layout.reg_bases))]


@pytest.mark.parametrize("stream,bits", [("key", 4), ("key", 3), ("value", 4), ("value", 3)])
@pytest.mark.parametrize("block_n", [16, 32, 64])
def test_row_loads_read_the_words_the_slot_sources_name(stream, bits, block_n) -> None:
    """``_mma.row_loads_ptx`` run by the emulator for every lane puts into register j the word that
    ``key_slot_source`` / ``value_slot_source`` name for the (token, slot) of register j in the kernel's layout (the
    same formulas, here in Python): 4-bit slot s is word s, 3-bit key slot 4t + i word 3t + i (i = 3: none, 0), 3-bit
    value slot 2g + w word 3(g >> 1) + (g & 1) + w; tokens from the live count on read 0. Rows padded beyond their
    words (stride 20 / 16), so a stride mistaken for the row's length shows."""
    stride = 128 * bits // 32 + 4
    base = 0x7F00_0000_0000
    memory = {base + 4 * (token * stride + w): 1000 * token + w + 1 for token in range(block_n) for w in range(stride)}
    layout = (_mma.key_words_layout(block_n) if stream == "key" else _mma.value_words_layout(block_n, False))
    program = _mma.row_loads_ptx(stream, bits, stride, block_n)
    n = block_n // 2
    for live in (block_n, block_n - 5, 1, 0, -3):
        for lane in range(32):
            out = run_ptx(program, {n: base, 2 * n: live & 0xFFFFFFFF}, lane=lane, memory=memory)
            for j, (token, slot) in enumerate(_lane_coordinates(layout, lane)):
                if stream == "key":
                    word = slot if bits == 4 else 3 * (slot >> 2) + (slot & 3)
                    read = bits == 4 or slot & 3 < 3
                else:
                    g = slot >> 1
                    word = slot if bits == 4 else 3 * (g >> 1) + (g & 1) + (slot & 1)
                    read = True
                expected = 1000 * token + word + 1 if read and token < live else 0
                assert out[j] == expected, (live, lane, j, token, slot)
    with pytest.raises(ValueError, match="3 or 4 bits"):
        _mma.row_loads_ptx("key", 2, 8, 32)


def test_row_loads_serve_aligned_rows_only() -> None:
    words = torch.zeros(2, 3, 10, 16, dtype=torch.int32)
    assert _mma.row_loads_serve(words, "key", 4) and _mma.row_loads_serve(words, "value", 4)
    odd = torch.zeros(2, 3, 10, 18, dtype=torch.int32)[..., :16]  # token stride 18 words: not 16-byte aligned
    assert not _mma.row_loads_serve(odd, "key", 4) and _mma.row_loads_serve(odd, "value", 4)
    shifted = torch.zeros(2 * 3 * 10 * 16 + 1, dtype=torch.int32)[1:].view(2, 3, 10, 16)  # start 4 bytes in
    assert not _mma.row_loads_serve(shifted, "value", 4) and _mma.row_loads_serve(shifted, "key", 3)


@pytest.mark.parametrize("dim", [64, 128])
def test_pair_program_decodes_every_code_of_both_words(dim) -> None:
    table = _table(dim)
    lo0, lo1, hi0, hi1 = _byte_tables(table[8:])
    expected = _fp16_bits(table)
    words = _words(dim)
    for a, b in zip(words, reversed(words)):
        # pack=2: each scalar operand is passed once per packed element ($10/$11, $12/$13, ...)
        out = run_ptx(PRMT_PAIR4.value, {8: a, 9: b, 10: lo0, 11: lo0, 12: lo1, 13: lo1, 14: hi0, 15: hi0,
                                         16: hi1, 17: hi1})
        for c in range(8):  # $c: code c of A in the low half, of B in the high half
            assert out[c] == expected[(a >> (4 * c)) & 15] | expected[(b >> (4 * c)) & 15] << 16, (hex(a), hex(b), c)


def test_pair_lut_programs_decode_every_code_of_both_words() -> None:
    """``PAIR_LUT_FILL`` run by the 32 lanes of a warp, then ``PAIR_LUT4`` by each lane on its own words: the fp16 pairs
    ``PRMT_PAIR4`` writes (code c of A in the low half, of B in the high half); lane l reads only its copy
    (l mod ``PAIR_LUT_COPIES``), and no load of the warp puts more than two addresses in one bank (two wavefronts at
    most), whatever the codes."""
    table = _table()
    expected = _fp16_bits(table)
    entries = [int(e) for e in pair_lut_table(torch.from_numpy(table))]
    assert all(e & 0xFFFF == expected[i & 15] and (e >> 16) & 0xFFFF == expected[i >> 4] for i, e in enumerate(entries))
    base = 0x400  # where the table lands is the assembler's choice: any 16-byte-aligned address
    shared, symbols = SharedMemory(), {PAIR_LUT_SYMBOL: base}
    for lane in range(32):
        run_ptx(PAIR_LUT_FILL.value, {8 + i: entries[8 * lane + i] for i in range(8)}, lane, shared, symbols)
    assert sorted(shared) == [base + 4 * w for w in range(256 * PAIR_LUT_COPIES)]
    assert all(shared[base + 4 * (PAIR_LUT_COPIES * e + c)] == entries[e] & 0xFFFFFFFF
               for e in range(256) for c in range(PAIR_LUT_COPIES))
    words = _words(5)
    pairs = list(zip(words, reversed(words)))
    for warp in range(0, len(pairs) - 31, 32):  # one warp's load: lane l decodes pair warp + l
        shared.reads.clear()
        for lane in range(32):
            a, b = pairs[warp + lane]
            out = run_ptx(PAIR_LUT4.value, {8: a, 9: b}, lane, shared, symbols)
            for c in range(8):
                assert out[c] == expected[(a >> (4 * c)) & 15] | expected[(b >> (4 * c)) & 15] << 16, (hex(a), c)
        assert all((address - base) % (4 * PAIR_LUT_COPIES) == 4 * (lane % PAIR_LUT_COPIES)
                   for lane, reads in shared.reads.items() for address in reads)
        for load in zip(*(shared.reads[lane] for lane in range(32))):  # the k-th load of every lane
            banks: dict[int, set[int]] = {}
            for address in load:
                banks.setdefault((address // 4) % 32, set()).add(address)
            assert max(map(len, banks.values())) <= 2, load


def test_lut_serves_4_bit_streams_of_one_codebook_and_auto_takes_it_for_long_splits() -> None:
    from turboquant.kernels.decode_attention.mma import LUT_MIN_TILES, resolve_mma_decoder

    def cache(key_bits, value_bits, value_seed=0):
        return CacheFormat.build(*[[ChannelGroup(128, bits, tq.make_rotation("haar", 128, seed=seed).matrix(),
                                                 tq.lloyd_max_codebook(128, bits).centroids_tensor())]
                                   for bits, seed in ((key_bits, 0), (value_bits, value_seed))], "cpu")
    four = cache(4, 4, value_seed=5)  # another rotation, the same codebook
    assert resolve_mma_decoder("lut", four, 1) == "lut"
    assert resolve_mma_decoder("lut-keys", four, 1) == "lut-keys" and resolve_mma_decoder("lut-values", four, 1)
    assert torch.equal(four.mma_pair_table, pair_lut_table(tq.lloyd_max_codebook(128, 4).centroids_tensor()))
    assert resolve_mma_decoder("auto", four, LUT_MIN_TILES) == "lut-keys"
    assert resolve_mma_decoder("auto", four, LUT_MIN_TILES - 1) == "prmt"  # too few tiles to repay the fill
    assert resolve_mma_decoder("prmt", four, 10 * LUT_MIN_TILES) == "prmt"
    for key_bits, value_bits in ((3, 3), (4, 3)):
        assert resolve_mma_decoder("auto", cache(key_bits, value_bits), 10 * LUT_MIN_TILES) == "prmt"
        for decoder in ("lut", "lut-keys", "lut-values"):
            with pytest.raises(ValueError, match="4-bit keys and values of one channel group"):
                resolve_mma_decoder(decoder, cache(key_bits, value_bits), 1)
    with pytest.raises(ValueError, match="decoder must be one of"):
        resolve_mma_decoder("table", four, 1)
    with pytest.raises(ValueError, match="4-bit codebooks"):
        pair_lut_table(torch.zeros(8))


def _mixed_code(slot: int, c: int) -> int:
    """Code c of a mixed slot word (``_mma`` module docstring): codes 0-3 4-bit at bits 0-15, codes 4-7 3-bit."""
    return (slot >> (4 * c)) & 15 if c < 4 else (slot >> (16 + 3 * (c - 4))) & 7


def test_mixed_pair_program_decodes_every_code_of_both_slots() -> None:
    outlier_table = tq.lloyd_max_codebook(32, 4).centroids_tensor().numpy().astype(np.float16)
    table3 = tq.lloyd_max_codebook(96, 3).centroids_tensor().numpy().astype(np.float16)
    expected = {4: _fp16_bits(outlier_table), 3: _fp16_bits(table3)}
    operands = {}
    for i, table in enumerate(_byte_tables(outlier_table[8:]) + _byte_tables(table3)):
        operands[10 + 2 * i] = operands[11 + 2 * i] = table  # pack=2: each scalar twice
    rng = np.random.default_rng(44)
    slots = [sum(((c + k) % 16) << (4 * k) for k in range(4)) | sum(((c + k) % 8) << (16 + 3 * k) for k in range(4))
             for c in range(16)]  # every code at every position
    slots += [int(w) for w in rng.integers(0, 2 ** 32, size=300, dtype=np.uint64)] + [0, 2 ** 32 - 1]  # bits 28-31 set
    for a, b in zip(slots, reversed(slots)):
        out = run_ptx(PRMT_PAIR_MIXED.value, {8: a, 9: b, **operands})
        for c in range(8):
            value = expected[4 if c < 4 else 3]
            assert out[c] == value[_mixed_code(a, c)] | value[_mixed_code(b, c)] << 16, (hex(a), hex(b), c)


def _funnel(low: int, high: int, shift: int) -> int:
    return ((high << 32 | low) >> shift) & 0xFFFFFFFF


def test_split_slots_hold_the_codes_of_their_channels() -> None:
    """What ``_mma.split_key_slots`` / ``split_value_slots`` compute from the words they load (the same formulas, in
    NumPy) holds, at code c of slot s, the code of stream channel ``_key_slot_channel(s, c)`` /
    ``_value_slot_channel(s, c)``: the outlier row's for channels < 32, the 3-bit row's (channel - 32) above. Mixed
    slots (key slots 4t, 4t + 1, value slots 2g) are read as ``PRMT_PAIR_MIXED`` reads them, the others as 3-bit groups
    of 24 bits (bits above them unread)."""
    rng = np.random.default_rng(5)
    mask = 0xFFFFFFFF
    for _ in range(50):
        outlier_row = rng.integers(0, 256, size=16, dtype=np.uint8)
        row = rng.integers(0, 256, size=36, dtype=np.uint8)
        o, w = (r.view("<u4").astype(np.uint64).tolist() for r in (outlier_row, row))

        def code(channel: int) -> int:
            return _row_bits(outlier_row, 4 * channel, 4) if channel < 32 else _row_bits(row, 3 * (channel - 32), 3)

        key_slots = {}
        for t in range(4):  # lane t: outlier word t, 3-bit words 2t .. 2t + 2 at bit offset 8t
            x0, x1, x2 = _funnel(w[2 * t], w[2 * t + 1], 8 * t), _funnel(w[2 * t + 1], w[2 * t + 2], 8 * t), \
                w[2 * t + 2] >> 8 * t
            key_slots.update({4 * t: (o[t] & 0xFFFF) | (x0 << 16) & mask,
                              4 * t + 1: (o[t] >> 16) | ((x0 >> 12) << 16) & mask,
                              4 * t + 2: (x0 >> 24) | (x1 << 8) & mask, 4 * t + 3: (x1 >> 16) | (x2 << 16) & mask})
        value_slots = {}
        for g in range(8):  # lane group g: 3-bit words g, g + 1 at bit offset 4g, half g & 1 of outlier word g >> 1
            half = o[g >> 1] >> 16 * (g & 1)
            x0, x1 = _funnel(w[g], w[g + 1], 4 * g), w[g + 1] >> 4 * g
            value_slots.update({2 * g: (half & 0xFFFF) | (x0 << 16) & mask, 2 * g + 1: (x0 >> 12) | (x1 << 20) & mask})
        for slots, channel, mixed in ((key_slots, _mma._key_slot_channel, lambda s: s & 3 < 2),
                                      (value_slots, _mma._value_slot_channel, lambda s: s & 1 == 0)):
            for slot, word in slots.items():
                for c in range(8):
                    got = _mixed_code(word, c) if mixed(slot) else (word >> 3 * c) & 7
                    assert got == code(int(channel(torch.tensor(slot), torch.tensor(c), True))), (slot, c)


def _join_tree(outputs: list[np.ndarray]) -> np.ndarray:
    """What the kernel's nested ``gl.join`` of asm outputs 0..2^j - 1 builds: output i at index bits of i appended
    as axes, least significant first."""
    if len(outputs) == 1:
        return outputs[0]
    half = len(outputs) // 2
    pairs = [np.stack([outputs[2 * i], outputs[2 * i + 1]], axis=-1) for i in range(half)]
    return _join_tree(pairs) if half > 1 else pairs[0]


def _planes(value) -> list[np.ndarray]:
    """What the 8 outputs of PRMT_PAIR4 hold for a word tile, as a function ``value(c)`` of the code index c."""
    return [value(c) for c in range(8)]


@pytest.mark.parametrize("block_n", [16, 32, 64])
def test_key_tile_columns_are_the_key_channel_order(block_n) -> None:
    word = np.arange(16)[None, :].repeat(block_n, 0)
    token = np.arange(block_n)[:, None].repeat(16, 1)

    def tile(planes):
        joined = _join_tree(planes).reshape(block_n, *(2,) * 7)
        return np.transpose(joined, _mma.KEY_AXES.value).reshape(block_n, 128)

    assert (tile(_planes(lambda c: 8 * word + c)) == _mma.key_channel_order().numpy()[None, :]).all()
    assert (tile(_planes(lambda c: token)) == np.arange(block_n)[:, None]).all()
    split = _planes(lambda c: _mma._key_slot_channel(torch.from_numpy(word), torch.tensor(c), True).numpy())
    # _split_key_planes: the mixed (i1 = 0) and 3-bit (i1 = 1) pairs taken apart, decoded, put back: the identity
    parts = [np.split(np.transpose(p.reshape(block_n, 4, 2, 2), (0, 1, 3, 2)), 2, axis=-1) for p in split]
    put_back = [np.transpose(np.concatenate(halves, axis=-1), (0, 1, 3, 2)).reshape(block_n, 16) for halves in parts]
    assert all((a == b).all() for a, b in zip(put_back, split))
    split_order = _mma.key_channel_order(split=True).numpy()
    assert (tile(split) == split_order[None, :]).all()
    # decoded_split_keys: the outlier columns are u1 = 0, c2 = 0 of the (token, u1, c2, c1, c0, t1, t0, u0) tile
    axes = np.transpose(_join_tree(split).reshape(block_n, *(2,) * 7), _mma.KEY_AXES.value)
    assert (axes[:, 0, 0].reshape(block_n, 32) == split_order[None, :32]).all() and (split_order[:32] < 32).all()


@pytest.mark.parametrize("block_n", [16, 32, 64])
def test_value_tile_rows_are_the_value_channel_order(block_n) -> None:
    word = np.arange(16)[None, :].repeat(block_n, 0)
    token = np.arange(block_n)[:, None].repeat(16, 1)

    def tile(planes):
        joined = _join_tree(planes).reshape(block_n, 8, *(2,) * 4)
        return np.transpose(joined, _mma.VALUE_AXES.value).reshape(128, block_n)

    assert (tile(_planes(lambda c: 8 * word + c)) == _mma.value_channel_order().numpy()[:, None]).all()
    assert (tile(_planes(lambda c: token)) == np.arange(block_n)[None, :]).all()
    split = _planes(lambda c: _mma._value_slot_channel(torch.from_numpy(word), torch.tensor(c), True).numpy())
    split_order = _mma.value_channel_order(split=True).numpy()
    assert (tile(split) == split_order[:, None]).all()
    # decoded_split_values: the top tile joins planes 0-3, (token, g, w, c0, c1) -> (c1 c0 w g, token): rows m < 64
    top = np.transpose(_join_tree(split[:4]).reshape(block_n, 8, 2, 2, 2), (4, 3, 2, 1, 0)).reshape(64, block_n)
    assert (top == split_order[:64, None]).all()
    m = np.arange(128)
    assert ((split_order < 32) == ((m < 64) & (m & 8 == 0))).all()  # the rows the kernel takes from the top product


def test_channel_orders_are_permutations() -> None:
    for split in (False, True):
        for order in (_mma.key_channel_order(split=split), _mma.value_channel_order(split=split)):
            assert sorted(order.tolist()) == list(range(128))
    k = torch.arange(128)  # the split kernel's outlier positions: key order k < 32, value rows m < 64 with m & 8 == 0
    assert torch.equal(_mma.key_channel_order(split=True) < 32, k < 32)
    assert torch.equal(_mma.value_channel_order(split=True) < 32, (k < 64) & (k & 8 == 0))


def _format(bits: int = 4, dim: int = 128, groups: int = 1, device: str = "cpu", outlier_bits: int = 4) -> CacheFormat:
    def stream(seed):
        layout = [(dim, bits)] if groups == 1 else [(32, outlier_bits), (dim - 32, outlier_bits - 1)]
        return [ChannelGroup(m, b, tq.make_rotation("haar", m, seed=seed + i, device=device).matrix(),
                             tq.lloyd_max_codebook(m, b).centroids_tensor(device)) for i, (m, b) in enumerate(layout)]
    return CacheFormat.build(stream(0), stream(5), device)


def test_refuses_what_it_does_not_read() -> None:
    assert _format().mma_unsupported(32, 8) is None
    assert _format(bits=3).mma_unsupported(32, 8) is None
    assert "3- and 4-bit" in _format(bits=2).mma_unsupported(32, 8)
    assert "head_dim" in _format(dim=64).mma_unsupported(32, 8)
    assert _format(groups=2).mma_unsupported(32, 8) is None  # the 3.5-bit preset's split
    assert "32 outlier channels at 4 bits" in _format(groups=2, outlier_bits=3).mma_unsupported(32, 8)
    assert "GQA" in _format().mma_unsupported(32, 1)


def test_auto_takes_the_tile_kernel_where_mma_cannot_serve() -> None:
    from turboquant.backends import decode_kernel

    assert decode_kernel("auto", "cpu", None).chosen == "tiles"  # no Gluon off the GPU
    assert decode_kernel("auto", None, None).chosen == "mma"  # the layout alone
    assert decode_kernel("auto", None, "3-bit codes").chosen == "tiles"
    with pytest.raises(ValueError, match="kernel='mma' cannot serve.*3-bit codes"):
        decode_kernel("mma", None, "3-bit codes")
    with pytest.raises(ValueError, match="kernel must be one of"):
        decode_kernel("fast", None, None)


def test_launch_names_the_refusal(device) -> None:
    from turboquant.kernels.decode_attention import decode_attention_groups_triton

    cache_format = _format(bits=2, device=str(device))
    lead = (1, 8, 4)
    codes = [g.packed(torch.zeros(*lead, 32, dtype=torch.uint8, device=device), torch.ones(lead, device=device))
             for g in cache_format.key_groups]
    with pytest.raises(ValueError, match="kernel='mma' cannot serve"):
        decode_attention_groups_triton(torch.zeros(1, 32, 128, device=device), codes, codes,
                                       torch.tensor([4], device=device), cache_format, kernel="mma")


def test_pipeline_depth_refusal() -> None:
    """The register-operand kernel pipelines its loads 1 or 2 tiles deep; another depth is refused by name, not run
    as something else."""
    from turboquant.kernels.decode_attention.mma import _meta

    with pytest.raises(ValueError, match="1 or 2 stages"):
        _meta(4, 32, 3, 4, 4, "prmt", (16, 16))
    assert _meta(4, 32, 2, 4, 4, "prmt", (16, 16))["STAGES"] == 2


@pytest.mark.parametrize("groups", [1, 2])
def test_query_map_gathers_the_rotated_query_in_key_order(groups) -> None:
    cache_format = _format(groups=groups)
    q = torch.randn(3, 128)
    rotated = q @ torch.block_diag(*(g.rotation for g in cache_format.key_groups)).T  # Pi_g q_g as rows
    order = _mma.key_channel_order(split=groups == 2)
    assert torch.allclose(q @ cache_format.mma_query_map, rotated[:, order], atol=1e-5)
    assert torch.equal(cache_format.mma_value_rows, _mma.value_channel_order(split=groups == 2).int())


@pytest.mark.slow
def test_offline_compile_for_sm90_keeps_operands_in_registers() -> None:
    """Offline compile for sm_90 (no GPU; a subprocess, since the interpreter this suite runs under compiles
    nothing): the decoded tiles reach the MMA without a layout conversion (``assert_trivial`` fails the compile
    otherwise) and nothing in the token loop touches shared memory, in the decode split kernel and in the scores
    kernel; before the loop, the query's conversion (four 32-channel slices, a fifth for the split's outlier
    rows); the one-group decode kernels keep their residency and their row loads."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "benchmarks.compile_offline", "--ops", "mma"], capture_output=True,
                         text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    header = next(line for line in run.stdout.splitlines() if line.startswith("| launch"))
    keys = [k.strip() for k in header.strip("|").split("|")]
    rows = [dict(zip(keys, (c.strip() for c in line.strip("|").split("|")))) for line in run.stdout.splitlines()
            if "mma_split_kernel" in line or "mma_scores_kernel" in line]
    assert [row["kernel"] for row in rows] == (["mma_split_kernel"] * 7 + ["mma_scores_kernel"]  # 4-bit variants
                                               + ["mma_split_kernel"] * 2 + ["mma_scores_kernel"]  # K3V3, K4V3, b=3
                                               + ["mma_split_kernel"])  # the 3.5-bit split
    for row in rows:
        assert int(row["HMMA"]) > 0 and int(row["loop"]) > 0, row
        slices = 5 if "split" in row["launch"] else 4
        # 16-byte stores of 4 table copies before the loop, 8 loads / 16 codes of each stream the table decodes
        lut_streams = {"lut": 2, "lut-keys": 1, "lut-values": 1}.get(row["launch"].split()[-1], 0)
        assert int(row["LDSM"]) <= slices and int(row["STS"]) <= 2 * slices + 2 * PAIR_LUT_COPIES * (lut_streams > 0)
        assert row["stack"] == "0" and row["loop shared"] == str(64 * lut_streams), row
        if lut_streams:  # the loop's only shared-memory accesses are the lookups, one per two codes: no decoded tile
            assert int(row["LDS"]) == 64 * lut_streams and int(row["PRMT"]) < 200 + 180 * (2 - lut_streams), row
        if "bn32 prefetch" in row["launch"] and "split" not in row["launch"]:
            # one-group streams load their code words by _mma.row_loads_ptx: 12 one-warp programs per SM stay resident
            # (words left undefined past the live tokens cost ptxas 193-227 registers) and the loop has no per-load
            # address arithmetic (about 1,030-1,060 instructions with it)
            assert int(row["regs"]) <= 168 and int(row["loop"]) < 1000, row


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Gluon kernel runs on a CUDA GPU only")
@pytest.mark.parametrize("batch,tokens,group", [(2, 300, 4), (3, 1000, 6), (1, 70, 7), (2, 129, 16)])
@pytest.mark.parametrize("key_bits,value_bits", [("split", "split"), (4, 4), (3, 3), (4, 3)])
def test_mma_kernel_matches_reference_on_gpu(batch, tokens, group, key_bits, value_bits) -> None:
    """One channel group per stream, or both split as the 3.5-bit preset (32 outlier channels at 4 bits, 96 at 3,
    in a random channel order per row and KV head, as the cache stores it: the query gathered into it, the output
    scattered back); random codes, norms fp16 for keys and fp32 for values. The split runs first: the LLM holds'
    3.5-bit rows wait on it, and a kernels call's test budget may end before the last case."""
    from turboquant.kernels.decode_attention import decode_attention_groups_reference, decode_attention_groups_triton

    def stream(bits, seed):
        layout = [(32, 4), (96, 3)] if bits == "split" else [(128, bits)]
        return [ChannelGroup(m, b, tq.make_rotation("haar", m, seed=seed + i, device="cuda").matrix(),
                             tq.lloyd_max_codebook(m, b).centroids_tensor("cuda")) for i, (m, b) in enumerate(layout)]
    cache_format = CacheFormat.build(stream(key_bits, 0), stream(value_bits, 5), "cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    lead = (batch, 2, tokens)

    def fields(groups, norm_dtype):
        return [g.packed(torch.randint(0, 256, (*lead, g.dim * g.bits // 8), dtype=torch.uint8, device="cuda",
                                       generator=gen),
                         (torch.rand(lead, device="cuda", generator=gen) + 0.5).to(norm_dtype)) for g in groups]
    keys = fields(cache_format.key_groups, torch.float16)
    values = fields(cache_format.value_groups, torch.float32)
    q = torch.randn(batch, 2 * group, 128, device="cuda", generator=gen, dtype=torch.bfloat16)
    seq_lens = torch.randint(1, tokens + 1, (batch,), device="cuda", generator=gen, dtype=torch.int32)
    perms = {name: torch.rand(batch, 2, 128, device="cuda", generator=gen).argsort(dim=-1)
             for name in ("key_permutation", "value_permutation")} if key_bits == "split" else {}
    ref = decode_attention_groups_reference(q, keys, values, seq_lens, cache_format, **perms)
    decoders = ("prmt", "lut") if (key_bits, value_bits) == (4, 4) else ("prmt",)
    cases = list(itertools.product(((1, 32, 2), (3, 32, 1), (2, 16, 2), (1, 64, 1)), decoders))
    if (key_bits, value_bits) == (4, 4):  # the table for one stream: the same programs, one tiling suffices
        cases += [((2, 32, 2), "lut-keys"), ((2, 32, 2), "lut-values")]
    for (splits, block_n, stages), decoder in cases:
        out = decode_attention_groups_triton(q, keys, values, seq_lens, cache_format, kernel="mma", num_splits=splits,
                                             block_n=block_n, num_stages=stages, decoder=decoder, **perms)
        assert ((out.double() - ref).norm() / ref.norm()) < 1e-2, (splits, block_n, stages, decoder)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Gluon kernel runs on a CUDA GPU only")
@pytest.mark.parametrize("sets,queries,keys", [(3, 4, 1000), (2, 7, 257), (1, 16, 33)])
@pytest.mark.parametrize("bits", [3, 4])
def test_mma_scores_match_reference_on_gpu(sets, queries, keys, bits) -> None:
    from turboquant.kernels.scores import mse_scores_reference, mse_scores_triton

    gen = torch.Generator(device="cuda").manual_seed(1)
    cb = tq.lloyd_max_codebook(128, bits).centroids_tensor("cuda")
    codes = torch.randint(0, 256, (sets, keys, 16 * bits), dtype=torch.uint8, device="cuda", generator=gen)
    norms = torch.rand(sets, keys, device="cuda", generator=gen).half() + 0.5
    q = torch.randn(sets, queries, 128, device="cuda", generator=gen)
    ref = mse_scores_reference(q, codes, norms, cb, bits, scale=0.3)
    out = mse_scores_triton(q, codes, norms, cb, bits, scale=0.3, kernel="mma")
    assert ((out.double() - ref).norm() / ref.norm()) < 2e-3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Gluon kernel runs on a CUDA GPU only")
def test_mma_kernels_replay_in_a_cuda_graph() -> None:
    """After one eager call, the scores and decode launches are capturable: no host-to-device copy inside (the
    channel orders and byte tables are made once per device / tensor), and a replay on new inputs is exact."""
    from turboquant.kernels.decode_attention import decode_attention_groups_triton
    from turboquant.kernels.scores import mse_scores_triton

    gen = torch.Generator(device="cuda").manual_seed(2)
    cb = tq.lloyd_max_codebook(128, 4).centroids_tensor("cuda")
    codes = torch.randint(0, 256, (2, 2, 300, 64), dtype=torch.uint8, device="cuda", generator=gen)
    norms = torch.rand(2, 2, 300, device="cuda", generator=gen).half() + 0.5
    q = torch.randn(2, 8, 128, device="cuda", generator=gen)
    group = [ChannelGroup(128, 4, tq.make_rotation("haar", 128, seed=0, device="cuda").matrix(), cb)]
    cache_format = CacheFormat.build(group, group, "cuda")
    fields = [group[0].packed(codes, norms)]
    seq_lens = torch.tensor([300, 123], dtype=torch.int32, device="cuda")
    calls = {"scores": lambda: mse_scores_triton(q[0, None, :4], codes[0, 0, None], norms[0, 0, None], cb, 4,
                                                 kernel="mma"),
             "decode": lambda: decode_attention_groups_triton(q, fields, fields, seq_lens, cache_format, kernel="mma")}
    for name, call in calls.items():
        call()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = call()
        q.normal_(generator=gen)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, call()), name


def test_mma_scores_refusals() -> None:
    from turboquant.kernels.scores_mma import mma_scores_unsupported

    cb = tq.lloyd_max_codebook(128, 4).centroids_tensor()
    codes = torch.zeros(1, 8, 64, dtype=torch.uint8)
    assert mma_scores_unsupported(torch.zeros(1, 4, 128), codes, cb, 4) is None
    assert "3- and 4-bit codes of 128" in mma_scores_unsupported(torch.zeros(1, 4, 64), codes[..., :32], cb, 4)
    assert "3- and 4-bit codes of 128" in mma_scores_unsupported(torch.zeros(1, 4, 128), codes[..., :32], cb, 2)
    assert "at most 16 queries" in mma_scores_unsupported(torch.zeros(1, 17, 128), codes, cb, 4)
    assert "32-bit words" in mma_scores_unsupported(torch.zeros(1, 4, 128), codes[:, :, 1:63], cb, 4)
    assert "symmetric" in mma_scores_unsupported(torch.zeros(1, 4, 128), codes, cb.abs(), 4)
