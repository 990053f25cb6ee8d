"""How much a quantized KV cache perturbs attention, layer by layer, on a real model's keys and values.

A diagnostic for the needle / LongBench results: one needle prompt is prefilled at full precision, its
post-RoPE keys/values and the queries of its last ``--queries`` positions are captured, and every method's
cache stores the keys/values and reads them back exactly as it does during generation. Per layer it
reports

* ``key_error`` / ``value_error``: mean relative reconstruction error ||k~ - k|| / ||k|| over tokens and heads;
* ``logit_error_std``: std of (q.k~ - q.k) / sqrt(d), the perturbation of the attention logits;
* ``output_error``: ||softmax(q K~ᵀ/√d) V~ - softmax(q Kᵀ/√d) V|| / ||softmax(q Kᵀ/√d) V|| (causal).

Methods that draw random state (rotations) run once per ``--seeds`` entry, so the spread due to the
quantizer's draw is visible. Token-evicting methods (SnapKV, PyramidKV) are not meaningful here.

    python scripts/kv_attention_error.py --methods turboquant_3p5,turboquant_3p5_centered,kivi_3bit --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO_ROOT))

import pandas as pd  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from experiments.data.haystack import load_haystack  # noqa: E402
from experiments.io import config_to_dict  # noqa: E402
from experiments.kv_generation import KVMethod  # noqa: E402
from experiments.models import load_model, model_spec_from_config  # noqa: E402
from experiments.needle import NeedleTask, PromptBuilder, method_runs  # noqa: E402
from turboquant.kvcache import CompressedCache, FullPrecisionLayer, attach, build_cache  # noqa: E402


CONFIGS = REPO_ROOT / "configs"


def load_method(name: str) -> KVMethod:
    """A ``configs/method/<name>.yaml`` file as a :class:`KVMethod` (seed defaults to 0)."""
    raw = OmegaConf.load(CONFIGS / "method" / f"{name}.yaml")
    options = config_to_dict(raw.get("options") or {})  # `seed: ${oc.select:seed,0}` resolves to 0 here
    return KVMethod(key=name, label=str(raw.get("label", name)), cache=str(raw.cache), options=options)


class _QueryCapture(FullPrecisionLayer):
    """A full-precision layer that keeps the queries of the last ``n_queries`` positions the model attends with."""

    def __init__(self, layer_idx: int, n_queries: int) -> None:
        super().__init__(layer_idx)
        self.n_queries, self.queries = n_queries, None

    def attend(self, module, query, key, value, attention_mask, attention, **kwargs):
        self.queries = query[:, :, -self.n_queries:].float()
        return super().attend(module, query, key, value, attention_mask, attention, **kwargs)


@torch.inference_mode()
def capture(model, input_ids: torch.Tensor, n_queries: int) -> list[dict[str, torch.Tensor]]:
    """Per layer: post-RoPE keys/values (1, H_kv, n, d) of the prompt and queries (1, H_q, m, d) of its last m tokens,
    as the model's attention receives them (``attach``: no projection is recomputed here)."""
    layers = [_QueryCapture(index, n_queries) for index in range(model.config.num_hidden_layers)]
    cache = CompressedCache(layers, method="full", options={})
    with attach(model, cache):
        model(input_ids=input_ids, cache=cache, use_cache=True)
    return [{"queries": layer.queries, "keys": layer.keys.float(), "values": layer.values.float()}
            for layer in cache.layers]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal softmax attention of the last m positions (GQA by repetition); (output, scaled logits)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    m, n = q.shape[2], k.shape[2]
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    visible = torch.ones(m, n, dtype=torch.bool).tril(n - m)
    return logits.masked_fill(~visible, float("-inf")).softmax(-1) @ v, logits.masked_fill(~visible, 0.0)


@torch.inference_mode()
def layer_errors(model, layers: list[dict[str, torch.Tensor]], method: KVMethod) -> list[dict[str, float]]:
    """Store every layer's keys/values in a fresh cache of ``method`` and read them back as a decode step does."""
    cache = build_cache(method.cache, model.config, **method.options)
    rows = []
    for index, data in enumerate(layers):
        keys, values, queries = data["keys"], data["values"], data["queries"]
        cache.update(keys[:, :, :-1], values[:, :, :-1], index)
        keys_read, values_read = (t.float() for t in cache.update(keys[:, :, -1:], values[:, :, -1:], index))
        if keys_read.shape != keys.shape:
            raise ValueError(f"{method.key} does not keep every token (an eviction method): not measurable here")
        exact_out, exact_logits = attention(queries, keys, values)
        out, logits = attention(queries, keys_read, values_read)
        visible = torch.ones(logits.shape[-2:], dtype=torch.bool).tril(keys.shape[2] - queries.shape[2])
        rows.append({
            "layer": index,
            "key_error": float(((keys_read - keys).norm(dim=-1) / keys.norm(dim=-1)).mean()),
            "value_error": float(((values_read - values).norm(dim=-1) / values.norm(dim=-1)).mean()),
            "logit_error_std": float((logits - exact_logits)[..., visible].std()),
            "output_error": float((out - exact_out).norm() / exact_out.norm()),
            "memory_ratio": float(cache.memory_ratio()),
        })
    return rows


def key_statistics(layers: list[dict[str, torch.Tensor]]) -> pd.DataFrame:
    """Per layer, the keys' shape that decides a rotation quantizer's error: the mean key norm ||k|| (the error of
    TurboQuant_mse scales with it, Theorem 1 is for unit vectors) and, over KV heads, the largest ratio of one
    channel's RMS to the median channel's RMS (the outlier channels a per-channel scale absorbs and a rotation spreads)."""
    rows = []
    for index, layer in enumerate(layers):
        keys = layer["keys"][0].float()                      # (H_kv, n, d)
        channel_rms = keys.pow(2).mean(dim=1).sqrt()         # (H_kv, d)
        rows.append({"layer": index, "key_norm": float(keys.norm(dim=-1).mean()),
                     "channel_peak_ratio": float((channel_rms.max(-1).values / channel_rms.median(-1).values).max())})
    return pd.DataFrame(rows)


MEASURES = ("key_error", "value_error", "logit_error_std", "output_error", "memory_ratio")


def write_summary(table: pd.DataFrame, path: Path, title: str) -> None:
    """Markdown beside the per-layer CSV: each method's means over layers (mean +- SE over seeds), and the
    per-layer logit-error std (mean over seeds), which shows where in the model the attention logits are perturbed."""
    per_seed = table.groupby(["method", "seed"], dropna=False)[list(MEASURES)].mean()
    grouped = per_seed.groupby(level="method", sort=False)
    mean, se = grouped.mean(), grouped.sem()  # NaN with one seed: no spread to report
    order = list(dict.fromkeys(table["method"]))
    lines = [f"# {title}", "", "Mean over layers; ± is the standard error over rotation seeds (none for a method run once).", "",
             "| method | seeds | " + " | ".join(MEASURES) + " |", "|---|---|" + "---|" * len(MEASURES)]
    for method in order:
        cells = [f"{mean.loc[method, c]:.3f}" + ("" if pd.isna(se.loc[method, c]) else f" ± {se.loc[method, c]:.3f}")
                 for c in MEASURES]
        lines.append(f"| {method} | {grouped.size()[method]} | " + " | ".join(cells) + " |")
    layers = table.pivot_table(index="layer", columns="method", values="logit_error_std", aggfunc="mean")[order]
    lines += ["", "Logit-error std per layer (mean over seeds):", "",
              "| layer | " + " | ".join(order) + " |", "|---|" + "---|" * len(order)]
    lines += [f"| {layer} | " + " | ".join(f"{v:.3f}" for v in row) + " |" for layer, row in layers.iterrows()]
    path.write_text("\n".join(lines) + "\n")


def stored_rows(path: Path, **prompt: float) -> pd.DataFrame | None:
    """The rows of ``path`` that ``--append`` keeps (None when there is no file yet); an error when they were made
    with other prompt options (``context``, ``depth``, ``queries``) than ``prompt``."""
    if not path.is_file():
        return None
    stored = pd.read_csv(path)
    differs = {k: sorted(stored[k].unique()) if k in stored else "not recorded" for k, v in prompt.items()
               if k not in stored or (stored[k] != v).any()}
    if differs:
        raise SystemExit(f"{path}: its rows were made with other prompt options ({differs}) than {prompt}; "
                         "--append adds rows of the same prompt only")
    return stored


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2_135m", help="a configs/model/ name")
    parser.add_argument("--model-set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key of the model config (repeatable), e.g. pretrained=/data/q15 "
                             "gguf_file=q.gguf packaged_gguf=null, as run.py's model.KEY=VALUE")
    parser.add_argument("--methods", default="turboquant_3p5,turboquant_3p5_centered,kivi_3bit,polarquant")
    parser.add_argument("--seeds", default="0,1,2", help="method seeds for methods with random state")
    parser.add_argument("--context", type=int, default=1536)
    parser.add_argument("--depth", type=float, default=0.5)
    parser.add_argument("--queries", type=int, default=64, help="last prompt positions whose attention is measured")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "results" / "kv_attention_error.csv")
    parser.add_argument("--append", action="store_true",
                        help="add these methods' rows to --out (replacing their old rows), keeping the others; the "
                             "prompt options must be the ones the stored rows were made with")
    parser.add_argument("--summarize", type=Path, metavar="CSV",
                        help="only write the markdown summary of a CSV this script wrote (beside it), computing nothing")
    parser.add_argument("--keys-only", action="store_true",
                        help="only write the per-layer key statistics (<out>_keys.csv), no cache is run")
    parser.add_argument("--title", default=None, help="the summary's title (default: model, prompt and queries)")
    args = parser.parse_args(argv)
    if args.summarize is not None:
        write_summary(pd.read_csv(args.summarize), args.summarize.with_suffix(".md"),
                      args.title or f"Attention perturbation per layer ({args.summarize.name})")
        return 0

    model_cfg = OmegaConf.load(CONFIGS / "model" / f"{args.model}.yaml")
    for item in args.model_set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--model-set takes KEY=VALUE, got {item!r}")
        OmegaConf.update(model_cfg, key, None if value == "null" else value, force_add=True)
    stored = stored_rows(args.out, context=args.context, depth=args.depth, queries=args.queries) if args.append else None
    spec = model_spec_from_config(model_cfg)
    loaded = load_model(spec)
    task_cfg = config_to_dict(OmegaConf.load(CONFIGS / "needle_task" / "sf_sandwich.yaml"))
    task = NeedleTask(**task_cfg)
    prompt = PromptBuilder(loaded.tokenizer, load_haystack("paul_graham_essays").text, task).build(args.context, args.depth)
    layers = capture(loaded.model, prompt.input_ids, args.queries)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    keys_path = args.out.with_name(f"{args.out.stem}_keys.csv")
    key_statistics(layers).to_csv(keys_path, index=False)
    print(f"per-layer key statistics written to {keys_path}")
    if args.keys_only:
        return 0

    methods = {name: load_method(name) for name in args.methods.split(",")}
    frames = []
    for method, seed in method_runs(methods, [int(s) for s in args.seeds.split(",")]):
        rows = pd.DataFrame(layer_errors(loaded.model, layers, method))
        frames.append(rows.assign(method=method.key, label=method.label, seed=seed, context=args.context,
                                  depth=args.depth, queries=args.queries))
        print(f"{method.key:28s} seed {seed!s:4s} " + "  ".join(
            f"{c} {rows[c].mean():.3f}" for c in ("key_error", "value_error", "logit_error_std", "output_error")),
            flush=True)
    table = pd.concat(frames, ignore_index=True)
    if stored is not None:  # --append: keep the other methods' rows of the same prompt
        table = pd.concat([stored[~stored["method"].isin(table["method"].unique())], table], ignore_index=True)
    table.to_csv(args.out, index=False)
    title = args.title or (f"Attention perturbation per layer: {spec.display_name}, needle prompt of "
                           f"{prompt.prompt_tokens} tokens at depth {args.depth}, last {args.queries} queries")
    write_summary(table, args.out.with_suffix(".md"), title)
    summary = table.groupby(["method", "seed"], dropna=False)[list(MEASURES)].mean()
    print(f"\n{spec.display_name}, needle prompt of {prompt.prompt_tokens} tokens at depth {args.depth}, "
          f"last {args.queries} queries; mean over {len(layers)} layers:\n{summary.round(4).to_string()}")
    print(f"per-layer rows written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
