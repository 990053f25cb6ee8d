"""Same GPU code? Compile every Triton kernel at two commits for a CUDA target, without a GPU, and diff the PTX.

    python scripts/check_identical_ptx.py                      # base = merge base of HEAD and main, sm_90
    python scripts/check_identical_ptx.py --base <commit> --arch 80

Each commit is checked out with ``git worktree add --detach`` into a temporary directory. There, the entry points
(quantize, quantize_prod, scores, and decode attention on one-group, outlier-split and split-with-QJL-keys caches,
with ragged lengths and channel permutations; caches with 3-bit groups also at 16- and 64-token tiles and with
the register decoder) are called on small CPU tensors with Triton's launcher replaced by an offline compile:
Triton's own argument binder and specialization, then ``triton.compile`` for the target (ptxas ships with Triton).
A refactor that keeps every launch's PTX the same keeps the GPU numerics the same.

PTX is compared after removing what a pure refactor may change: debug line info and labels, the order of the
parameter loads and register numbering (registers renamed by first use). Parameter *order* is not compared (its
loads are dropped): the interpreter tests show the arguments reach the same values. Prints, per launch,
``identical`` or the number of differing lines; exits 1 if any launch differs.
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# runs inside a checked-out tree (cwd = tree): compiles every launch offline, writes [[kernel, ptx], ...] as JSON
_DRIVER = r"""
import json, sys
import torch
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile as triton_compile, make_backend
from triton.runtime import jit

out_path, arch = sys.argv[1], int(sys.argv[2])
target = GPUTarget("cuda", arch, 32)
backend = make_backend(target)
launches = []

def compile_instead(self, *args, grid, warmup, **kwargs):
    binder = jit.create_function_from_signature(self.signature, self.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound, specialization, options)
    kernel = triton_compile(ASTSource(self, signature, constexprs, attrs), target=target, options=options.__dict__)
    launches.append([self.fn.__name__, kernel.asm["ptx"]])

jit.JITFunction.run = compile_instead
import turboquant as tq
from turboquant.kernels import decode_attention as da, quantize, quantize_prod, scores
for module in list(sys.modules.values()):
    if getattr(module, "__name__", "").startswith("turboquant.kernels") and hasattr(module, "check_device"):
        module.check_device = lambda device: None

gen = torch.Generator().manual_seed(0)

def codes(lead, dim, bits):
    return tq.pack_codes(torch.randint(0, 2 ** bits, (*lead, dim), generator=gen), bits)

def group(lead, dim, bits, seed, qjl=False):
    norms = (torch.rand(*lead, generator=gen) + 0.5).half()
    tensors = (codes(lead, dim, bits) if bits else torch.empty(*lead, 0, dtype=torch.uint8), norms,
               codes(lead, dim, 1) if qjl else None, norms if qjl else None)
    spec = da.ChannelGroup(dim, bits, tq.make_rotation("haar", dim, seed=seed).matrix() if bits else None,
                           tq.lloyd_max_codebook(dim, bits).centroids_tensor() if bits else None,
                           torch.randn(dim, dim, generator=gen) if qjl else None, 1.0 if qjl else None)
    # trees before the single packed-code type (QuantizedVectors) passed a GroupFields tuple
    return spec, spec.packed(*tensors) if hasattr(spec, "packed") else da.GroupFields(*tensors)

x = torch.randn(300, 96, generator=gen).half()
for bits in (4, 3, 2):
    cb = tq.lloyd_max_codebook(96, bits)
    quantize.quantize_mse_triton(x, tq.make_rotation("haar", 96, seed=0).matrix(), cb.boundaries, bits)
prod = tq.TurboQuantProd(64, 3, seed=0)
quantize_prod.quantize_prod_triton(x[:, :64], prod.mse.rotation.matrix(), prod.mse.codebook.boundaries,
                                   prod.mse.codebook.centroids_tensor(), 2, prod.qjl.matrix)
for bits in (4, 3):
    centroids = tq.lloyd_max_codebook(128, bits).centroids_tensor()
    scores.mse_scores_triton(torch.randn(2, 4, 128, generator=gen), codes((2, 70), 128, bits),
                             torch.rand(2, 70, generator=gen).half(), centroids, bits)
layouts = [([(128, 4, False)], [(128, 4)]), ([(40, 2, False)], [(40, 3)]),
           ([(32, 4, False), (96, 3, False)], [(32, 4), (96, 3)]),
           ([(32, 3, True), (96, 2, True)], [(32, 4), (96, 3)]), ([(10, 3, True), (30, 0, True)], [(10, 2), (30, 4)])]
for key_layout, value_layout in layouts:
    lead, dim = (2, 2, 50), sum(g[0] for g in key_layout)
    keys = [group(lead, m, b, 3 + i, q) for i, (m, b, q) in enumerate(key_layout)]
    values = [group(lead, m, b, 7 + i) for i, (m, b) in enumerate(value_layout)]
    fmt = da.CacheFormat.build([s for s, _ in keys], [s for s, _ in values], "cpu")
    perm = torch.rand(2, 2, dim, generator=gen).argsort(-1) if len(keys) == 2 else None
    q = torch.randn(2, 8, dim, generator=gen)
    launch = (q, [f for _, f in keys], [f for _, f in values], torch.tensor([50, 17], dtype=torch.int32), fmt)
    da.decode_attention_groups_triton(*launch, key_permutation=perm, value_permutation=perm, num_splits=2,
                                      return_lse=perm is None)
    # 3-bit groups: both sides of the channel-order tile rule, both decoders
    if any(g[1] == 3 for g in key_layout + value_layout):
        for block_n, decoder in ((16, "table"), (16, "prmt"), (64, "prmt")):
            da.decode_attention_groups_triton(*launch, key_permutation=perm, value_permutation=perm, num_splits=2,
                                              block_n=block_n, decoder=decoder)
json.dump(launches, open(out_path, "w"))
"""


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout.strip()


def canonical(ptx: str) -> list[str]:
    """The kernel body's instructions without line info, labels and parameter loads, registers renamed by first use."""
    body = ptx[ptx.index(".entry"):]
    body = body[body.index(")\n"):]
    body = re.sub(r"\.section\s+\.debug.*", "", body, flags=re.S)
    lines = [line.strip() for line in body.splitlines()]
    lines = [line for line in lines if line and not line.startswith((".loc", ".file", "ld.param", "//"))
             and not re.fullmatch(r"\$L__tmp\d+:", line)]
    names: dict[str, str] = {}
    per_kind: Counter[str] = Counter()

    def rename(match: re.Match) -> str:
        if match.group(0) not in names:
            names[match.group(0)] = f"%{match.group(1)}#{per_kind[match.group(1)]}"
            per_kind[match.group(1)] += 1
        return names[match.group(0)]

    return [re.sub(r"%(rd|rs|r|fd|f|p|hh|h|b)\d+\b", rename, re.sub(r"\$L__\w+", "L", line)) for line in lines]


def compile_at(tree: Path, arch: int, out: Path) -> list[list[str]]:
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env |= {"PYTHONPATH": str(tree), "TRITON_DEFAULT_FP_FUSION": "1"}
    done = subprocess.run([sys.executable, "-c", _DRIVER, str(out), str(arch)], cwd=tree, env=env,
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"compiling in {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default=None, help="commit to compare with (default: merge base of HEAD, main)")
    parser.add_argument("--head", default="HEAD")
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability x 10 (90: H100 / H200)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed check still removes its worktrees
    commits = {"base": git("rev-parse", args.base or git("merge-base", "HEAD", "main")),
               "head": git("rev-parse", args.head)}
    import triton

    print(f"base {commits['base'][:12]}  head {commits['head'][:12]}  sm_{args.arch}, Triton {triton.__version__}")
    with tempfile.TemporaryDirectory(prefix="identical-ptx-") as tmp:
        trees = {side: Path(tmp) / side for side in commits}
        try:
            for side, commit in commits.items():
                git("worktree", "add", "--detach", str(trees[side]), commit)
            base, head = (compile_at(trees[side], args.arch, Path(tmp) / f"{side}.json") for side in commits)
        finally:
            for tree in trees.values():
                if tree.exists():
                    git("worktree", "remove", "--force", str(tree))
    if len(base) != len(head):
        print(f"DIFFERENT: {len(base)} launches at base, {len(head)} at head")
        return 1
    differing = 0
    for (base_name, base_ptx), (head_name, head_ptx) in zip(base, head):
        a, b = canonical(base_ptx), canonical(head_ptx)
        changed = sum(line[:1] in "+-" and line[:3] not in ("+++", "---")
                      for line in difflib.unified_diff(a, b, lineterm="", n=0))
        print(f"{base_name.lstrip('_')} / {head_name.lstrip('_')}: {len(a)} instructions, "
              f"{'identical' if not changed else f'{changed} lines differ'}")
        differing += bool(changed)
    return 1 if differing else 0


if __name__ == "__main__":
    raise SystemExit(main())
