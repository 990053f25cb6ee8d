"""TokenBuffer (amortised O(1) appends along the token axis) and the stores built on it: what they hold equals
the ``torch.cat`` of every appended chunk, and byte accounting counts the stored rows, not the capacity."""

from __future__ import annotations

import math

import pytest
import torch

from turboquant.kvcache import ModelShape, build_cache
from turboquant.kvcache.base import TokenBuffer, tensor_nbytes
from turboquant.kvcache.kivi import KIVIEncoder
from turboquant.kvcache.polarquant import PolarEncoder
from turboquant.kvcache.stream import Encoder, Fields, QuantizedStream
from turboquant.kvcache.turboquant_cache import TurboQuantEncoder

CPU = torch.device("cpu")


def random_chunks(generator: torch.Generator, shape_before: tuple[int, ...], shape_after: tuple[int, ...],
                  sizes: list[int], dtype: torch.dtype) -> list[torch.Tensor]:
    chunks = []
    for size in sizes:
        x = torch.randn(*shape_before, size, *shape_after, generator=generator)
        chunks.append((x * 40).to(dtype) if dtype in (torch.uint8, torch.int16) else x.to(dtype))
    return chunks


@pytest.mark.parametrize("shape_before, shape_after, dtype", [
    ((2, 3), (24,), torch.uint8),     # packed codes (batch, heads, tokens, bytes)
    ((1, 2), (), torch.float16),      # norms (batch, heads, tokens)
    ((2, 1), (2, 64), torch.float32),  # KIVI scales per (token group, channel), an extra trailing axis
])
def test_views_equal_the_concatenation_through_many_appends(shape_before, shape_after, dtype):
    generator = torch.Generator().manual_seed(0)
    sizes = [300] + torch.randint(0, 9, (400,), generator=generator).tolist()  # a prefill, then 0..8 rows each
    chunks = random_chunks(generator, shape_before, shape_after, sizes, dtype)
    buffer = TokenBuffer()
    earlier = []
    for step, chunk in enumerate(chunks):
        view = buffer.append(chunk)
        reference = torch.cat(chunks[: step + 1], dim=2)
        assert view.dtype == reference.dtype and torch.equal(view, reference)
        assert buffer.nbytes() == tensor_nbytes(reference) <= buffer.allocated_nbytes()
        assert buffer.capacity <= max(math.ceil(buffer.growth * buffer.length), buffer.length + buffer.min_rows)
        if step % 50 == 0:
            earlier.append((view, reference))
    for view, reference in earlier:  # rows are never rewritten: views taken earlier keep their values
        assert torch.equal(view, reference)


def test_appends_reallocate_logarithmically_often():
    """Amortised O(1): over T one-row appends the storage is reallocated O(log T) times, so the rows copied by
    reallocations sum to at most T * growth / (growth - 1) (here: 5 T), not the T^2 / 2 of a torch.cat per append."""
    buffer, storages, copied = TokenBuffer(), set(), 0
    for _ in range(5000):
        before, filled = buffer.storage, buffer.length
        buffer.append(torch.zeros(1, 2, 1, 8))
        if buffer.storage is not before:
            storages.add(id(buffer.storage))
            copied += filled
    assert buffer.length == 5000
    assert len(storages) <= math.ceil(math.log(5000 / buffer.min_rows, buffer.growth)) + 2
    assert copied <= 5000 * buffer.growth / (buffer.growth - 1)


def test_storage_made_in_inference_mode_keeps_growing_outside_it():
    buffer = TokenBuffer()
    with torch.inference_mode():
        buffer.append(torch.ones(1, 1, 3, 4))
    buffer.append(torch.full((1, 1, 2, 4), 2.0))  # an in-place write into an inference tensor would raise
    assert torch.equal(buffer.tensor, torch.cat([torch.ones(1, 1, 3, 4), torch.full((1, 1, 2, 4), 2.0)], dim=2))


def test_bad_appends_and_settings_raise_value_errors():
    buffer = TokenBuffer()
    buffer.append(torch.zeros(1, 2, 3, 8))
    with pytest.raises(ValueError, match="cannot append"):
        buffer.append(torch.zeros(1, 2, 1, 4))
    with pytest.raises(ValueError, match="cannot append"):
        buffer.append(torch.zeros(1, 2, 1, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="token axis"):
        buffer.append(torch.zeros(1, 2))
    with pytest.raises(ValueError, match="growth"):
        TokenBuffer(growth=1.0)


class RecordingEncoder(Encoder):
    """Wraps an encoder and keeps a copy of the fields of every chunk it encodes (the torch.cat reference)."""

    def __init__(self, inner: Encoder) -> None:
        self.inner, self.chunks = inner, []

    def prepare(self, prefill: torch.Tensor) -> None:
        self.inner.prepare(prefill)

    def encode(self, x: torch.Tensor) -> Fields:
        fields = self.inner.encode(x)
        self.chunks.append({name: value.clone() for name, value in fields.items()})
        return fields

    def decode(self, fields: Fields) -> torch.Tensor:
        return self.inner.decode(fields)

    def side_nbytes(self) -> int:
        return self.inner.side_nbytes()


@pytest.mark.parametrize("make_encoder, residual_length, policy", [
    (lambda: TurboQuantEncoder(64, [(64, 3)], "mse", "haar", 0, CPU), 0, "block"),
    (lambda: TurboQuantEncoder(64, [(16, 3), (48, 2)], "prod", "hadamard", 0, CPU, center=True), 16, "block"),
    (lambda: KIVIEncoder(2, 32, 64, "tokens"), 32, "block"),
    (lambda: KIVIEncoder(3, 32, 64, "channels"), 16, "sliding"),
    (lambda: PolarEncoder(64, (4, 2, 2, 2), "haar", 0, CPU), 8, "block"),
], ids=["turboquant", "turboquant-prod-split-window", "kivi-keys", "kivi-values", "polarquant"])
def test_stream_store_equals_the_concatenation_of_its_chunks(make_encoder, residual_length, policy):
    """Prefill, then 1-3 tokens per step: the packed fields and the workspace are the torch.cat of every flushed
    chunk's fields / decoded chunk, and the stored bytes are those of that concatenation."""
    generator = torch.Generator().manual_seed(1)
    encoder = RecordingEncoder(make_encoder())
    stream = QuantizedStream(encoder, residual_length, policy, torch.float16, torch.float32)
    stream.append(torch.randn(2, 2, 70, 64, generator=generator))
    for size in torch.randint(1, 4, (100,), generator=generator).tolist():
        stream.append(torch.randn(2, 2, size, 64, generator=generator))
    assert len(encoder.chunks) >= 5
    reference = {name: torch.cat([chunk[name] for chunk in encoder.chunks], dim=2) for name in encoder.chunks[0]}
    assert stream.fields.keys() == reference.keys()
    for name, value in reference.items():
        assert torch.equal(stream.fields[name], value), name
    workspace = torch.cat([encoder.decode(chunk) for chunk in encoder.chunks], dim=2)
    assert torch.equal(stream.workspace, workspace)
    assert stream.packed_nbytes() == tensor_nbytes(*reference.values())
    assert stream.nbytes() == stream.packed_nbytes() + tensor_nbytes(stream.residual) + encoder.side_nbytes()
    assert stream.allocated_nbytes() >= stream.nbytes()


@pytest.mark.parametrize("method, options", [
    ("full", {}), ("turboquant", {"bits": 3}), ("kivi", {"bits": 2, "residual_length": 32}), ("polarquant", {}),
])
def test_layers_report_stored_bytes_not_capacity(method, options):
    """Token by token: nbytes follows the byte formula exactly while the buffers hold spare capacity."""
    shape = ModelShape(num_layers=1, num_kv_heads=2, head_dim=64)
    cache = build_cache(method, shape, **options)
    layer = cache.layers[0]
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(1, 2, 40, 64, generator=generator)
    layer.update(x, x, 0)
    slack_seen = False
    for _ in range(40):
        x = torch.randn(1, 2, 1, 64, generator=generator)
        layer.update(x, x, 0)
        assert cache.nbytes() == cache.expected_nbytes() <= cache.allocated_nbytes()
        slack_seen |= cache.allocated_nbytes() > cache.nbytes()
    assert slack_seen
    if method == "full":
        assert layer.keys.shape == (1, 2, 80, 64) and torch.equal(layer.values[:, :, -1:], x.half())
