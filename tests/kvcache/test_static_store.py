"""The static store of a fused TurboQuant cache (``capacity=``): allocated once, written at a token count held on the
device, so that a decode step can be captured in a CUDA graph. On the CPU the fused kernel runs in Triton's
interpreter; the capture itself is checked on a GPU only."""
import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton")

from tests.kvcache.test_fused_attention import DEVICE, PROMPT, greedy, prompt_ids, tiny_model  # noqa: F401 (fixtures)
from tests.kvcache.tiny_llama import relative_error
from turboquant.kvcache import attach, build_cache
from turboquant.kvcache.base import StaticTokenBuffer, TokenBuffer


def test_static_buffer_holds_what_a_growing_one_holds() -> None:
    static, growing = StaticTokenBuffer(capacity=12), TokenBuffer()
    gen = torch.Generator().manual_seed(0)
    for n in (5, 1, 1, 3):
        rows = torch.randint(0, 255, (2, 3, n, 4), generator=gen, dtype=torch.uint8)
        assert torch.equal(static.append(rows), growing.append(rows))
    assert static.length == int(static.device_length) == 10 and static.storage.shape[2] == 12
    assert static.nbytes() == growing.nbytes() and static.allocated_nbytes() == 2 * 3 * 12 * 4
    with pytest.raises(ValueError, match="cannot take 3 more after 10"):
        static.append(torch.zeros(2, 3, 3, 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="cannot append rows"):
        static.append(torch.zeros(2, 3, 1, 5, dtype=torch.uint8))
    static.device_length.add_(2)  # what two graph replays do
    assert static.length == 10 and static.resync() == 12 and static.tensor.shape[2] == 12


@pytest.mark.parametrize("options", [
    {"key_bits": 4, "value_bits": 4},
    {"bits": 3.5, "center_keys": True},  # outlier split, per-row channel orders, key mean restored
])
def test_static_cache_decodes_as_the_growing_one(tiny_model, prompt_ids, options) -> None:
    """Same tokens and logits as the fused cache whose store grows (the kernel reads the whole storage, bounded by the
    device-side count, so only the split boundaries differ); the bytes are those of the stored tokens."""
    ids = torch.cat([prompt_ids[:, :PROMPT], prompt_ids[:, 150:150 + PROMPT]])
    growing = build_cache("turboquant", tiny_model.config, fused_decode=True, **options)
    static = build_cache("turboquant", tiny_model.config, fused_decode=True, capacity=PROMPT + 8, **options)
    want_logits, want_tokens = greedy(tiny_model, ids, growing, fused=True)
    got_logits, got_tokens = greedy(tiny_model, ids, static, fused=True)
    assert torch.equal(got_tokens, want_tokens)
    assert relative_error(got_logits, want_logits) < 1e-4
    assert static.nbytes() == growing.nbytes() == static.expected_nbytes()
    layer = static.layers[0]
    assert layer.key_stream.field_buffers["codes0"].storage.shape[2] == PROMPT + 8
    layer.after_graph_replays()  # nothing replayed: the counts stand
    assert layer.get_seq_length() == growing.layers[0].get_seq_length()


def test_static_cache_refusals(tiny_model, prompt_ids) -> None:
    config = tiny_model.config
    with pytest.raises(ValueError, match="fused_decode=True"):
        build_cache("turboquant", config, capacity=100)
    with pytest.raises(ValueError, match="keeps layers"):
        build_cache("turboquant", config, fused_decode=True, capacity=100, boundary_layers=1)
    window = build_cache("turboquant", config, fused_decode=True, capacity=100, residual_length=16)
    with pytest.raises(ValueError, match="residual_length=16"), torch.no_grad():
        tiny_model(prompt_ids[:, :20], cache=window)
    full = build_cache("turboquant", config, fused_decode=True, capacity=20)
    with torch.no_grad(), attach(tiny_model, full):
        tiny_model(prompt_ids[:, :20], cache=full)
        with pytest.raises(ValueError, match="cannot take 1 more after 20"):
            tiny_model(prompt_ids[:, 20:21], cache=full)


def _as_in_a_capture(monkeypatch) -> None:
    """What a CUDA-graph capture changes for a decode step, on the CPU: the quantizers and the static store record
    their tests on the device, and transformers builds the attention mask it skips outside graphs."""
    import transformers.masking_utils

    import turboquant as tq

    monkeypatch.setattr(tq.quantizers, "_capturing", lambda: True)
    monkeypatch.setattr(transformers.masking_utils, "is_tracing", lambda *args, **kwargs: True)


def _padded_batch(prompt_ids) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = prompt_ids[:, :30].repeat(2, 1)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    return ids, mask, torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype, device=mask.device)], dim=-1)


def test_padded_decode_is_refused(tiny_model, prompt_ids) -> None:
    """The kernel has no per-token mask: a decode step whose mask hides a stored token is refused, and a mask that
    hides nothing changes nothing (transformers masks a static store over its whole capacity, as its StaticLayer)."""
    ids, mask, step_mask = _padded_batch(prompt_ids)
    cache = build_cache("turboquant", tiny_model.config, fused_decode=True, capacity=40)
    with torch.no_grad(), attach(tiny_model, cache):
        tiny_model(ids, attention_mask=mask, cache=cache)
        with pytest.raises(ValueError, match="unpadded batches.*hides a stored token"):
            tiny_model(ids[:, -1:], attention_mask=step_mask, cache=cache)
    outputs = []
    for step_mask in (None, torch.ones_like(step_mask)):
        cache = build_cache("turboquant", tiny_model.config, fused_decode=True, capacity=40)
        with torch.no_grad(), attach(tiny_model, cache):
            tiny_model(ids, cache=cache)
            outputs.append(tiny_model(ids[:, -1:], attention_mask=step_mask, cache=cache).logits)
    assert torch.equal(*outputs)


def test_a_padded_mask_met_in_a_graph_is_reported(tiny_model, prompt_ids, monkeypatch) -> None:
    """Inside a capture the mask test is recorded on the device (the step runs on) and raised after the replays."""
    ids, mask, step_mask = _padded_batch(prompt_ids)
    cache = build_cache("turboquant", tiny_model.config, fused_decode=True, capacity=40)
    with torch.no_grad(), attach(tiny_model, cache):
        tiny_model(ids, attention_mask=mask, cache=cache)
        tiny_model(ids[:, -1:], cache=cache)  # the warm-up, unmasked
        _as_in_a_capture(monkeypatch)
        tiny_model(ids[:, -1:], attention_mask=torch.cat([step_mask, step_mask[:, -1:]], dim=-1), cache=cache)
        monkeypatch.undo()
    with pytest.raises(ValueError, match="replayed CUDA graph's decode step ran under an attention mask"):
        cache.layers[0].after_graph_replays()
    cache.layers[0].after_graph_replays()  # the record was cleared


def test_a_captured_step_reads_the_length_on_the_device(tiny_model, prompt_ids, monkeypatch) -> None:
    """Inside a capture a static store's length is its device count, so the query offset and mask transformers
    derive from it follow the replays; a host int would freeze the capture-time length into the graph, and the
    replays' masks would hide the tokens written since."""
    cache = build_cache("turboquant", tiny_model.config, fused_decode=True, capacity=PROMPT + 8)
    with torch.no_grad(), attach(tiny_model, cache):
        tiny_model(prompt_ids[:, :PROMPT], cache=cache)
        tiny_model(prompt_ids[:, PROMPT:PROMPT + 1], cache=cache)  # the warm-up
    assert cache.get_seq_length() == PROMPT + 1
    _as_in_a_capture(monkeypatch)
    length, offset = cache.get_seq_length(), cache.get_query_offset(0)  # positions; the causal mask's query row
    for count in (length, offset):
        assert isinstance(count, torch.Tensor) and int(count) == PROMPT + 1
    for stream in (cache.layers[0].key_stream, cache.layers[0].value_stream):  # what a replay's write does
        for buffer in stream.field_buffers.values():
            buffer.device_length.add_(1)
    assert int(length) == int(offset) == PROMPT + 2
    monkeypatch.undo()
    cache.layers[0].after_graph_replays()
    assert cache.get_seq_length() == PROMPT + 2


def _called_from_triton() -> bool:
    """Whether the caller runs inside Triton (its CPU interpreter reads tensors on the host; a GPU launch does not)."""
    frame = sys._getframe(2)
    while frame is not None:
        if f"{os.sep}triton{os.sep}" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def test_a_static_decode_step_reads_no_tensor_on_the_host(tiny_model, prompt_ids, monkeypatch) -> None:
    """What a CUDA-graph capture forbids, found on the CPU: after its warm-up, a decode step over a static store
    converts no tensor to a host value and makes no data-dependent shape (each would synchronise a GPU, or be frozen
    into a captured graph). The interpreter's own reads, which stand for kernel launches, are exempt."""
    import turboquant as tq

    for quantizer in (tq.TurboQuantMSE, tq.TurboQuantProd):  # quantize in the Triton kernel, as on a GPU
        monkeypatch.setattr(quantizer, "_triton", property(lambda self: True))
    cache = build_cache("turboquant", tiny_model.config, fused_decode=True, capacity=PROMPT + 8, bits=3.5,
                        center_keys=True)
    position = torch.full((1, 1), PROMPT + 1, dtype=torch.long, device=DEVICE)
    with torch.no_grad(), attach(tiny_model, cache):
        tiny_model(prompt_ids[:, :PROMPT], cache=cache)
        tiny_model(prompt_ids[:, PROMPT:PROMPT + 1], cache=cache)  # the warm-up: the kernel's constants are built
        reads = []
        for name in ("item", "__bool__", "__int__", "__float__", "__index__", "tolist", "numpy", "nonzero", "cpu"):
            original = getattr(torch.Tensor, name)

            def guarded(self, *args, _name=name, _original=original, **kwargs):
                if not _called_from_triton():
                    caller = sys._getframe(1)
                    reads.append(f"{_name} at {os.path.relpath(caller.f_code.co_filename)}:{caller.f_lineno}")
                return _original(self, *args, **kwargs)
            monkeypatch.setattr(torch.Tensor, name, guarded)
        _as_in_a_capture(monkeypatch)  # the mask transformers builds there included
        tiny_model(prompt_ids[:, PROMPT + 1:PROMPT + 2], position_ids=position,
                   attention_mask=torch.ones(1, PROMPT + 2, dtype=torch.long, device=DEVICE), cache=cache)
        monkeypatch.undo()
    assert reads == [], sorted(set(reads))
    cache.layers[0].after_graph_replays()  # no extreme row was met; the counts read back


def test_extreme_rows_met_in_a_graph_are_reported() -> None:
    """Inside a capture the extreme-row test is kept on the device; ``check_captured_rows`` raises on it once."""
    import turboquant as tq

    quantizer = tq.TurboQuantMSE(16, 3, seed=0)
    quantizer.check_captured_rows()  # nothing recorded
    quantizer._captured_extreme = torch.ones((), dtype=torch.bool)  # what a replay that met a zero row leaves
    with pytest.raises(ValueError, match="replayed CUDA graph quantized a vector"):
        quantizer.check_captured_rows()
    quantizer.check_captured_rows()  # the record was cleared


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.filterwarnings("ignore::FutureWarning")  # past_key_values=: the keyword of the GPU image's transformers
def test_decode_step_replays_in_a_cuda_graph(tiny_model, prompt_ids) -> None:
    """One decode step captured over a static cache; each replay writes its token and advances the position on the
    device, and its logits are those of the same step run eagerly on a twin cache."""
    ids = prompt_ids[:, :PROMPT]
    caches = [build_cache("turboquant", tiny_model.config, fused_decode=True, capacity=PROMPT + 16) for _ in range(2)]
    eager, graphed = caches
    token = ids[:, -1:].clone()
    position = torch.full((1, 1), PROMPT, dtype=torch.long, device=DEVICE)
    with torch.no_grad(), attach(tiny_model, graphed):
        tiny_model(ids, past_key_values=graphed)

        def step():
            logits = tiny_model(token, position_ids=position, past_key_values=graphed).logits[:, -1].float()
            position.add_(1)
            return logits
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()  # warm-up: compiles, builds the kernel's constants, writes a first token
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = step()
    with torch.no_grad(), attach(tiny_model, eager):
        tiny_model(ids, past_key_values=eager)
        tiny_model(token, past_key_values=eager)  # the warm-up's token
        for i in range(3):
            token.copy_(ids[:, 10 + i:11 + i])
            graph.replay()
            want = tiny_model(token, past_key_values=eager).logits[:, -1].float()
            assert relative_error(captured, want) < 1e-4, i
    for layer in graphed.layers:
        layer.after_graph_replays()
    assert graphed.get_seq_length() == eager.get_seq_length() == PROMPT + 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_quantize_in_a_graph_records_extreme_rows() -> None:
    import turboquant as tq

    quantizer = tq.TurboQuantMSE(128, 4, seed=0, device="cuda")
    x = torch.randn(64, 128, device="cuda")
    quantizer.quantize(x)  # the warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        quantizer.quantize(x)
    graph.replay()
    quantizer.check_captured_rows()  # no extreme row
    x[3] = 0
    graph.replay()
    with pytest.raises(ValueError, match="replayed CUDA graph"):
        quantizer.check_captured_rows()
