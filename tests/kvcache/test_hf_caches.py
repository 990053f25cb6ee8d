"""The transformers-style cache classes (turboquant.kvcache.hf) and the README's cache program."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests.kvcache.tiny_llama import tiny_llama_config

from turboquant.kvcache import (CompressedCache, FullCache, KIVICache, PolarQuantCache, PyramidKVCache, SnapKVCache,
                                TurboQuantCache, attach, build_cache)

REPO = Path(__file__).resolve().parents[2]
CLASSES = {cls.METHOD: cls for cls in (FullCache, TurboQuantCache, KIVICache, PolarQuantCache, SnapKVCache,
                                       PyramidKVCache)}
README_PROGRAM = re.compile(r"<!-- hf-cache-program -->\s*```python\n(.*?)```", re.DOTALL)


def method_config(path: Path):
    """A configs/method/*.yaml file resolved as the experiments resolve it (seed 0, a 25% budget)."""
    root = OmegaConf.create({"seed": 0, "experiment": {"memory_ratio": 0.25}, "method": OmegaConf.load(path)})
    return OmegaConf.to_container(root, resolve=True)["method"]


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "method").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_method_config_builds_its_class(path: Path) -> None:
    config = tiny_llama_config(num_hidden_layers=6)  # vLLM's presets keep their first and last 2 layers in 16 bits
    method = method_config(path)
    cache = CLASSES[method["cache"]](config, **method["options"])
    reference = build_cache(method["cache"], config, **method["options"])
    assert isinstance(cache, CompressedCache) and cache.method == method["cache"]
    assert cache.options == reference.options
    assert [type(layer) for layer in cache.layers] == [type(layer) for layer in reference.layers]


def test_bad_option_names_the_method(tiny_config) -> None:
    with pytest.raises(ValueError, match="kivi"):
        KIVICache(tiny_config, nbits=4)


@pytest.mark.parametrize("cls, options", [(TurboQuantCache, {"bits": 3.5}), (SnapKVCache, {"memory_ratio": 0.25})])
def test_generate_takes_the_cache_by_either_keyword(cls, options, tiny_model, prompt_ids) -> None:
    """``cache=`` (transformers 5.x) and the deprecated ``past_key_values=`` give the same tokens, through the cache."""
    outputs = []
    for keyword in ("cache", "past_key_values"):
        cache = cls(tiny_model.config, **options)
        with warnings.catch_warnings(), attach(tiny_model, cache):
            warnings.simplefilter("ignore", FutureWarning)  # past_key_values= is deprecated
            outputs.append(tiny_model.generate(prompt_ids, **{keyword: cache}, max_new_tokens=4, do_sample=False,
                                               pad_token_id=0))
        assert cache.memory_ratio() < 0.3, "generate must have filled this cache, not one of its own"
    assert torch.equal(outputs[0], outputs[1])


def test_readme_cache_program_runs(tmp_path: Path, monkeypatch, capsys) -> None:
    """The README's program, as written there, on a tiny random Llama saved to disk (MODEL points at it)."""
    from tests.experiments.llm_fixtures import save_tiny_llama

    found = README_PROGRAM.findall((REPO / "README.md").read_text())
    assert len(found) == 1, "README.md must hold exactly one <!-- hf-cache-program --> python block"
    monkeypatch.setenv("MODEL", str(save_tiny_llama(tmp_path / "tiny")))
    namespace = {"__name__": "__main__"}
    exec(compile(found[0], "README.md:hf-cache-program", "exec"), namespace)
    cache = namespace["cache"]
    assert isinstance(cache, TurboQuantCache) and cache.get_seq_length() > namespace["inputs"]["input_ids"].shape[1]
    assert cache.memory_ratio() < 0.5, "the quantized cache must be smaller than the 16-bit one"
    expected = f"{cache.bits_per_value():.2f} bits per value, {100 * cache.memory_ratio():.1f}% of the 16-bit cache"
    assert capsys.readouterr().out.splitlines()[-1] == expected
