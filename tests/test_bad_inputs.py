"""Bad inputs and damaged files across the public API: every one gets a clear answer, none a silent one.

Each case is one call a careful user might make. An *error* case must raise ``ValueError`` whose message
matches the case's pattern (it names the problem, and the file for files); a *recover* case (a damaged
cache or results file) must warn with a message naming the file and still return the right answer; an
*ok* case (an unusual but valid input: NumPy integers, 1e-30, an empty batch) must work and pass its check.

``python tests/test_bad_inputs.py`` prints the cases by area and outcome: clear (the expected error or
warning), correct (a valid input handled right), unhelpful (another exception or a message that does not
name the problem), silent (no error where one was due, or a wrong answer).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import re
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import turboquant as tq
from experiments.io import ResultStore
from turboquant.kvcache import build_cache
from turboquant.kvcache.factory import ModelShape


@dataclasses.dataclass(frozen=True)
class Case:
    area: str
    name: str
    call: Callable[[Path], Any]   # gets a fresh empty directory
    kind: str                     # "error", "recover" or "ok"
    pattern: str = ""             # error / recover: regex the message must match ({tmp} = the directory)
    check: Callable[[Any], bool] = lambda result: True
    exception: type[Exception] = ValueError  # what an error case raises


CASES: list[Case] = []


def error(area: str, name: str, call: Callable[[Path], Any], pattern: str,
          exception: type[Exception] = ValueError) -> None:
    CASES.append(Case(area, name, call, "error", pattern, exception=exception))


def ok(area: str, name: str, call: Callable[[Path], Any], check: Callable[[Any], bool] = lambda r: True) -> None:
    CASES.append(Case(area, name, call, "ok", check=check))


def recover(area: str, name: str, call: Callable[[Path], Any], pattern: str, check: Callable[[Any], bool]) -> None:
    CASES.append(Case(area, name, call, "recover", pattern, check))


def outcome(case: Case, tmp: Path) -> tuple[str, str]:
    """(clear | correct | unhelpful | silent, what happened)."""
    pattern = case.pattern.replace("{tmp}", re.escape(str(tmp)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = case.call(tmp)
        except Exception as raised:  # noqa: BLE001 - classifying what a user would see is the point
            expected = case.kind == "error" and isinstance(raised, case.exception) and re.search(pattern, str(raised))
            return ("clear" if expected else "unhelpful"), f"{type(raised).__name__}: {raised}"
    if case.kind == "error":
        return "silent", f"no error, returned {result!r:.200}"
    if not case.check(result):
        return "silent", f"wrong answer {result!r:.200}"
    if case.kind == "ok":
        return "correct", "ok"
    messages = [str(w.message) for w in caught]
    if any(re.search(pattern, message) for message in messages):
        return "clear", messages[0]
    return "silent", f"right answer but no warning naming the file: {messages}"


# ----------------------------------------------------------------------------------------------- quantizers
DIM = 16
QUANTIZERS: dict[str, Callable[..., Any]] = {
    "TurboQuantMSE": lambda **kw: tq.TurboQuantMSE(**{"dim": DIM, "bits": 2, **kw}),
    "TurboQuantProd": lambda **kw: tq.TurboQuantProd(**{"dim": DIM, "bits": 2, **kw}),
    "QJL": lambda **kw: tq.QJL(**{"dim": DIM, **kw}),
}
INTEGER = r"must be an integer"

for qname, make in QUANTIZERS.items():
    area = "quantizers"
    for value in (1, 0, -3, 2.5, "16", None, True, np.float64(16.0)):
        error(area, f"{qname}(dim={value!r})", lambda tmp, make=make, v=value: make(dim=v), rf"dim {INTEGER} ≥ 2")
    for value in (None, 2.7, "0", -1, True, np.float64(1.0), [0]):
        error(area, f"{qname}(seed={value!r})", lambda tmp, make=make, v=value: make(seed=v), rf"seed {INTEGER}")
    for value in (0, -5, 1.5, None, "8"):
        error(area, f"{qname}(chunk_size={value!r})", lambda tmp, make=make, v=value: make(chunk_size=v),
              rf"chunk_size {INTEGER}")
    for value in ("gpu0", 3.5, "cuda:x"):
        error(area, f"{qname}(device={value!r})", lambda tmp, make=make, v=value: make(device=v),
              "device must be a torch.device or a device string")
    ok(area, f"{qname}(dim=np.int64)", lambda tmp, make=make: make(dim=np.int64(DIM)), lambda q: q.dim == DIM)
    ok(area, f"{qname}(seed=np.int32) = seed 5",
       lambda tmp, make=make: [q.dequantize(q.quantize(torch.ones(1, DIM)))
                               for q in (make(seed=np.int32(5)), make(seed=5))],
       lambda pair: torch.equal(*pair))
    if qname != "QJL":
        for value in (0, 9, -1, True, False, "3", 3.0, 2.5, None, np.float32(3)):
            error(area, f"{qname}(bits={value!r})", lambda tmp, make=make, v=value: make(bits=v),
                  rf"{qname} bits {INTEGER} in \[1, 8\]")
        ok(area, f"{qname}(bits=np.int64(3))", lambda tmp, make=make: make(bits=np.int64(3)), lambda q: q.bits == 3)
        for value in ("dct", None, 3, "HAAR"):
            error(area, f"{qname}(rotation={value!r})", lambda tmp, make=make, v=value: make(rotation=v),
                  "rotation must be one of")
        for value in ("laplace", None):
            error(area, f"{qname}(density={value!r})", lambda tmp, make=make, v=value: make(density=v),
                  "density must be one of")
        for value in ("cuda", None, "TORCH"):
            error(area, f"{qname}(backend={value!r})", lambda tmp, make=make, v=value: make(backend=v),
                  "backend must be one of")

    quantizer = make()
    for label, x, pattern in [
        ("int64", torch.ones(2, DIM, dtype=torch.int64), "integer tensor"),
        ("int32", torch.ones(2, DIM, dtype=torch.int32), "integer tensor"),
        ("uint8", torch.ones(2, DIM, dtype=torch.uint8), "integer tensor"),
        ("bool", torch.ones(2, DIM, dtype=torch.bool), "bool tensor"),
        ("complex64", torch.ones(2, DIM, dtype=torch.complex64), "complex tensor"),
        ("numpy array", np.ones((2, DIM), np.float32), "must be a torch.Tensor"),
        ("list", [[1.0] * DIM], "must be a torch.Tensor"),
        ("wrong last dim", torch.ones(2, DIM - 1), rf"last dimension {DIM}, got shape \(2, {DIM - 1}\)"),
        ("0-dim tensor", torch.tensor(1.0), rf"last dimension {DIM}"),
        ("NaN entry", torch.ones(3, DIM).index_fill_(1, torch.tensor([4]), float("nan")), "contains NaN or Inf"),
        ("+Inf entry", torch.ones(3, DIM).index_fill_(1, torch.tensor([4]), float("inf")), "contains NaN or Inf"),
        ("-Inf entry", torch.ones(3, DIM).index_fill_(1, torch.tensor([4]), -float("inf")), "contains NaN or Inf"),
        ("float64 norm beyond float32", torch.full((2, DIM), 1e39, dtype=torch.float64), "overflows or underflows"),
        ("float64 norm below float32", torch.full((2, DIM), 1e-300, dtype=torch.float64), "overflows or underflows"),
    ]:
        error(area, f"{qname}.quantize({label})", lambda tmp, q=quantizer, x=x: q.quantize(x), pattern)

    stored = quantizer.quantize(torch.randn(4, DIM, generator=torch.Generator().manual_seed(0)))
    for label, y, pattern in [
        ("int y", torch.ones(2, DIM, dtype=torch.int64), "y must be float16"),
        ("complex y", torch.ones(2, DIM, dtype=torch.complex64), "complex tensor"),
        ("wrong dim y", torch.ones(2, DIM + 1), f"y must have last dimension {DIM}"),
        ("NaN y", torch.full((2, DIM), float("nan")), "y contains NaN or Inf"),
        ("3-D y", torch.ones(2, 2, DIM), r"y must be \(m, 16\)"),
    ]:
        error(area, f"{qname}.inner_product({label})", lambda tmp, q=quantizer, y=y: q.inner_product(y, stored),
              pattern)
    other = make(seed=3).quantize(torch.ones(2, DIM))
    error(area, f"{qname}.dequantize(codes of seed 3)", lambda tmp, q=quantizer, o=other: q.dequantize(o),
          "these codes were made by")
    error(area, f"{qname}.dequantize(a tensor)", lambda tmp, q=quantizer: q.dequantize(torch.ones(2, DIM)),
          "expected QuantizedVectors, got Tensor")
    error(area, f"{qname} codes cat with other settings",
          lambda tmp, s=stored, o=other: tq.QuantizedVectors.cat([s, o]), "different settings")
    error(area, f"{qname} codes indexed to a scalar", lambda tmp, s=stored: s[0], "keep a batch dimension", IndexError)

    def direction_kept(q: Any, scale: float, dtype: torch.dtype = torch.float32) -> Callable[[Path], Any]:
        x = torch.randn(8, DIM, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        return lambda tmp: (q.quantize((x * scale).to(dtype)), q.quantize(x.float()), scale)

    def same_codes(result: tuple) -> bool:
        scaled, plain, scale = result
        fields = ("codes", "qjl_signs")
        codes_equal = all(torch.equal(getattr(scaled, f), getattr(plain, f)) for f in fields
                          if getattr(plain, f) is not None)
        return codes_equal and torch.allclose(scaled.norms.double() / scale, plain.norms.double(), rtol=1e-5)

    for scale in (1e-30, 1e30, 1e-20, 1e20):
        ok(area, f"{qname}.quantize(x * {scale:g}) keeps the direction", direction_kept(quantizer, scale), same_codes)
    ok(area, f"{qname}.quantize(x * 1e-200 in float64) keeps the direction",
       direction_kept(quantizer, 1e-35, torch.float64), same_codes)
    ok(area, f"{qname}.quantize(zero vectors)", lambda tmp, q=quantizer: q.dequantize(q.quantize(torch.zeros(3, DIM))),
       lambda out: bool((out == 0).all()))
    ok(area, f"{qname}.quantize(empty batch)", lambda tmp, q=quantizer: q.quantize(torch.zeros(0, DIM)),
       lambda codes: codes.norms.shape == (0,))
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        ok(area, f"{qname}.quantize({dtype})",
           lambda tmp, q=quantizer, d=dtype: q.dequantize(q.quantize(torch.ones(2, DIM, dtype=d))),
           lambda out, d=dtype: out.dtype == d and bool(torch.isfinite(out).all()))

for value in (0, 1.5):
    error("quantizers", f"TurboQuantMSE(threads={value})", lambda tmp, v=value: tq.TurboQuantMSE(DIM, 2, threads=v),
          rf"threads {INTEGER} ≥ 1")
error("quantizers", "QuantizedVectors.cat([])", lambda tmp: tq.QuantizedVectors.cat([]), "at least one")


# ----------------------------------------------------------------------------------------------- codebooks
for kwargs, pattern in [
    (dict(dim=1, bits=2), rf"dim {INTEGER} ≥ 2"), (dict(dim="64", bits=2), rf"dim {INTEGER}"),
    (dict(dim=True, bits=2), rf"dim {INTEGER}"), (dict(dim=64.0, bits=2), rf"dim {INTEGER}"),
    (dict(dim=None, bits=2), rf"dim {INTEGER}"),
    (dict(dim=64, bits=0), rf"bits {INTEGER} in \[1, 8\]"), (dict(dim=64, bits=9), rf"bits {INTEGER} in \[1, 8\]"),
    (dict(dim=64, bits=True), rf"bits {INTEGER}"), (dict(dim=64, bits="2"), rf"bits {INTEGER}"),
    (dict(dim=64, bits=2.0), rf"bits {INTEGER}"), (dict(dim=64, bits=None), rf"bits {INTEGER}"),
    (dict(dim=64, bits=2, density="laplace"), "density must be one of"),
    (dict(dim=64, bits=2, density=None), "density must be one of"),
    (dict(dim=64, bits=2, density=1), "density must be one of"),
]:
    error("codebooks", f"lloyd_max_codebook({kwargs})", lambda tmp, kw=kwargs: tq.lloyd_max_codebook(**kw), pattern)
ok("codebooks", "lloyd_max_codebook(np.int64, np.int64)", lambda tmp: tq.lloyd_max_codebook(np.int64(64), np.int64(2)),
   lambda cb: cb is tq.lloyd_max_codebook(64, 2))


@contextlib.contextmanager
def codebook_cache(tmp: Path) -> Iterator[Path]:
    """A private codebook cache directory (and an empty in-memory cache) for the duration of the block."""
    from turboquant import codebook as module

    previous = os.environ.get("TURBOQUANT_CACHE_DIR")
    os.environ["TURBOQUANT_CACHE_DIR"] = str(tmp)
    module._cached_codebook.cache_clear()
    try:
        yield tmp
    finally:
        module._cached_codebook.cache_clear()
        if previous is None:
            del os.environ["TURBOQUANT_CACHE_DIR"]
        else:
            os.environ["TURBOQUANT_CACHE_DIR"] = previous


def damaged_codebook(damage: Callable[[Path], None], dim: int = 24, bits: int = 2) -> Callable[[Path], Any]:
    """Write the (dim, bits) cache file, damage it, and load it again in a fresh process (cache cleared)."""
    from turboquant import codebook as module

    def call(tmp: Path) -> Any:
        with codebook_cache(tmp):
            good = tq.lloyd_max_codebook(dim, bits)
            path = module._disk_path(dim, bits, "exact")
            damage(path)
            module._cached_codebook.cache_clear()
            loaded = tq.lloyd_max_codebook(dim, bits)
            module._cached_codebook.cache_clear()
            reloaded = module._read_stored(path, dim, bits, "exact")  # the file was replaced by a good one
            return good, loaded, reloaded
    return call


def codebook_recovered(result: tuple) -> bool:
    good, loaded, reloaded = result
    return all(np.array_equal(cb.centroids, good.centroids) and cb.mse == good.mse for cb in (loaded, reloaded))


def rewrite(**changes: Callable[[np.ndarray], Any]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        with np.load(path) as stored:
            arrays = {name: stored[name] for name in stored.files}
        for name, change in changes.items():
            if change is None:
                del arrays[name]
            else:
                arrays[name] = change(arrays[name])
        np.savez(path, **arrays)
    return damage


CODEBOOK_DAMAGE: dict[str, Callable[[Path], None]] = {
    "0-byte file": lambda path: path.write_bytes(b""),
    "truncated to half": lambda path: path.write_bytes(path.read_bytes()[: path.stat().st_size // 2]),
    "truncated by 10 bytes": lambda path: path.write_bytes(path.read_bytes()[:-10]),
    "random bytes": lambda path: path.write_bytes(np.random.default_rng(0).bytes(600)),
    "a text file": lambda path: path.write_text("centroids = [0.1, 0.2]\n"),
    "a pickle": lambda path: np.save(path.with_suffix(""), np.array([{"a": 1}], dtype=object)) or
    os.replace(path.with_suffix(".npy"), path),
    "a bit flipped in the data": lambda path: path.write_bytes(
        (lambda b: b[:200] + bytes([b[200] ^ 0x10]) + b[201:])(path.read_bytes())),
    "centroids scaled by 1.01": rewrite(centroids=lambda c: c * 1.01),
    "another (dim, bits)'s centroids": rewrite(centroids=lambda c: tq.lloyd_max_codebook(64, 2).centroids,
                                               boundaries=lambda b: tq.lloyd_max_codebook(64, 2).boundaries),
    "centroids of 3 bits": rewrite(centroids=lambda c: tq.lloyd_max_codebook(24, 3).centroids),
    "mse edited": rewrite(mse=lambda m: m * 0.5),
    "NaN centroid": rewrite(centroids=lambda c: np.where(np.arange(c.size) == 1, np.nan, c)),
    "float32 arrays": rewrite(centroids=lambda c: c.astype(np.float32)),
    "boundaries missing": rewrite(boundaries=None),
    "mse missing": rewrite(mse=None),
    "unsorted centroids": rewrite(centroids=lambda c: c[::-1].copy(),
                                  boundaries=lambda b: b[::-1].copy()),
}
for label, damage in CODEBOOK_DAMAGE.items():
    recover("codebook cache files", f"cache file: {label}", damaged_codebook(damage),
            r"codebook cache file {tmp}/codebooks/exact_d24_b2_\w+\.npz is invalid", codebook_recovered)


# ----------------------------------------------------------------------------------------------- packing
for value in (0, 9, True, "2", 2.0, None):
    error("packing", f"pack_codes(bits={value!r})",
          lambda tmp, v=value: tq.pack_codes(torch.zeros(4, 8, dtype=torch.uint8), v), rf"bits {INTEGER} in \[1, 8\]")
    error("packing", f"unpack_codes(bits={value!r})",
          lambda tmp, v=value: tq.unpack_codes(torch.zeros(4, 2, dtype=torch.uint8), v, 8), rf"bits {INTEGER} in \[1, 8\]")
for label, codes, pattern in [
    ("float codes", torch.zeros(2, 8), "integer tensor"),
    ("bool codes", torch.zeros(2, 8, dtype=torch.bool), "integer tensor"),
    ("complex codes", torch.zeros(2, 8, dtype=torch.complex64), "integer tensor"),
    ("negative codes", torch.full((2, 8), -1), r"lie in \[0, 4\)"),
    ("codes ≥ 2^b", torch.full((2, 8), 4), r"lie in \[0, 4\)"),
    ("0-dim codes", torch.tensor(1), "at least one dimension"),
    ("numpy codes", np.zeros((2, 8), np.uint8), "torch.Tensor"),
    ("list codes", [[0, 1]], "torch.Tensor"),
]:
    error("packing", f"pack_codes({label})", lambda tmp, c=codes: tq.pack_codes(c, 2), pattern)
for label, packed, n, pattern in [
    ("int64 packed", torch.zeros(2, 2, dtype=torch.int64), 8, "must be uint8"),
    ("wrong last dim", torch.zeros(2, 3, dtype=torch.uint8), 8, "must have last dimension 2"),
    ("0-dim packed", torch.tensor(1, dtype=torch.uint8), 8, "must have last dimension"),
    ("numpy packed", np.zeros((2, 2), np.uint8), 8, "torch.Tensor"),
    ("n = -1", torch.zeros(2, 2, dtype=torch.uint8), -1, rf"n {INTEGER} ≥ 0"),
    ("n = 8.0", torch.zeros(2, 2, dtype=torch.uint8), 8.0, rf"n {INTEGER}"),
    ("n = None", torch.zeros(2, 2, dtype=torch.uint8), None, rf"n {INTEGER}"),
    ("n = True", torch.zeros(2, 2, dtype=torch.uint8), True, rf"n {INTEGER}"),
]:
    error("packing", f"unpack_codes({label})", lambda tmp, p=packed, n=n: tq.unpack_codes(p, 2, n), pattern)
for n, bits, pattern in [(-1, 2, rf"n {INTEGER} ≥ 0"), (2.5, 2, rf"n {INTEGER}"), (8, 0, rf"bits {INTEGER}"),
                         ("8", 2, rf"n {INTEGER}")]:
    error("packing", f"packed_size({n!r}, {bits!r})", lambda tmp, n=n, b=bits: tq.packed_size(n, b), pattern)
ok("packing", "packed_size(np.int64(10), np.int64(3))", lambda tmp: tq.packed_size(np.int64(10), np.int64(3)),
   lambda size: size == 4)
ok("packing", "pack/unpack round trip with np.int64 bits",
   lambda tmp: tq.unpack_codes(tq.pack_codes(torch.arange(8) % 8, np.int64(3)), np.int64(3), np.int64(8)),
   lambda codes: torch.equal(codes.long(), torch.arange(8) % 8))


# ----------------------------------------------------------------------------------------------- rotations
for cls in (tq.HaarRotation, tq.RandomizedHadamard):
    area, name = "rotations", cls.__name__
    for value in (1, "8", True, 2.5, None):
        error(area, f"{name}(dim={value!r})", lambda tmp, c=cls, v=value: c(v), rf"dim {INTEGER} ≥ 2")
    for value in (None, 2.7, -1, "1", True):
        error(area, f"{name}(seed={value!r})", lambda tmp, c=cls, v=value: c(8, seed=v), rf"seed {INTEGER}")
    error(area, f"{name}(device='gpu0')", lambda tmp, c=cls: c(8, device="gpu0"), "device must be a torch.device")
    rotation = cls(8)
    for method in ("apply", "inverse"):
        for label, x, pattern in [
            ("int64", torch.ones(2, 8, dtype=torch.int64), "integer tensor"),
            ("complex", torch.ones(2, 8, dtype=torch.complex64), "complex tensor"),
            ("bool", torch.ones(2, 8, dtype=torch.bool), "bool tensor"),
            ("wrong dim", torch.ones(2, 7), r"x must have last dimension 8, got shape \(2, 7\)"),
            ("numpy", np.ones((2, 8), np.float32), "must be a torch.Tensor"),
        ]:
            error(area, f"{name}.{method}({label})", lambda tmp, r=rotation, m=method, x=x: getattr(r, m)(x), pattern)
    ok(area, f"{name}(np.int64 dim and seed)", lambda tmp, c=cls: (c(np.int64(8), seed=np.int64(3)), c(8, seed=3)),
       lambda pair: torch.equal(pair[0].matrix(), pair[1].matrix()))
for value in ("dct", None, 1):
    error("rotations", f"make_rotation({value!r})", lambda tmp, v=value: tq.make_rotation(v, 8),
          "rotation must be one of")
for label, x, pattern in [("length 6", torch.ones(6), "power-of-two length"),
                          ("int", torch.ones(8, dtype=torch.int64), "integer tensor"),
                          ("complex", torch.ones(8, dtype=torch.complex64), "complex tensor")]:
    error("rotations", f"fast_walsh_hadamard({label})", lambda tmp, x=x: tq.fast_walsh_hadamard(x), pattern)


def haar_then_global_stream(tmp: Path) -> tuple[float, float]:
    """Build a quantizer after torch.manual_seed(seed), then draw the data from the same global stream."""
    torch.manual_seed(0)
    quantizer = tq.TurboQuantMSE(64, 2, seed=0, backend="torch")
    x = torch.randn(4000, 64)
    x = x / x.norm(dim=-1, keepdim=True)
    return ((quantizer.dequantize(quantizer.quantize(x)) - x) ** 2).sum(-1).mean().item(), quantizer.codebook.mse


ok("rotations", "data from torch's global stream after the rotation was built", haar_then_global_stream,
   lambda result: abs(result[0] / result[1] - 1) < 0.05)
ok("rotations", "building a rotation leaves torch's global stream alone",
   lambda tmp: (torch.manual_seed(0), torch.get_rng_state(), tq.HaarRotation(32), tq.QJL(32), torch.get_rng_state()),
   lambda result: torch.equal(result[1], result[4]))


# ----------------------------------------------------------------------------------------------- bounds
for label, call, pattern in [
    ("mse_upper_bound(-1)", lambda: tq.bounds.mse_upper_bound(-1), rf"bits {INTEGER} ≥ 0"),
    ("mse_upper_bound(True)", lambda: tq.bounds.mse_upper_bound(True), rf"bits {INTEGER}"),
    ("mse_lower_bound(1.5)", lambda: tq.bounds.mse_lower_bound(1.5), rf"bits {INTEGER}"),
    ("mse_lower_bound('2')", lambda: tq.bounds.mse_lower_bound("2"), rf"bits {INTEGER}"),
    ("prod_upper_bound(2, 1)", lambda: tq.bounds.prod_upper_bound(2, 1), rf"dim {INTEGER} ≥ 2"),
    ("prod_upper_bound(y_norm=-1)", lambda: tq.bounds.prod_upper_bound(2, 64, -1.0), "y_norm must be a finite number ≥ 0"),
    ("prod_lower_bound(y_norm=nan)", lambda: tq.bounds.prod_lower_bound(2, 64, float("nan")), "y_norm must be a finite"),
    ("prod_lower_bound(y_norm='1')", lambda: tq.bounds.prod_lower_bound(2, 64, "1"), "y_norm must be a real number"),
    ("prod_distortion(0, 64)", lambda: tq.bounds.prod_distortion(0, 64), "needs bits ≥ 1"),
    ("prod_distortion(2, 64.0)", lambda: tq.bounds.prod_distortion(2, 64.0), rf"dim {INTEGER}"),
]:
    error("bounds", label, lambda tmp, c=call: c(), pattern)
ok("bounds", "prod_upper_bound(np.int64, np.int64, np.float32)",
   lambda tmp: tq.bounds.prod_upper_bound(np.int64(2), np.int64(64), np.float32(1.0)),
   lambda value: value == tq.bounds.prod_upper_bound(2, 64, 1.0))


# ----------------------------------------------------------------------------------------------- KV caches
SHAPE = ModelShape(num_layers=2, num_kv_heads=2, head_dim=16)
CACHE_METHODS = {"full": {}, "turboquant": {"bits": 3}, "kivi": {"bits": 2, "group_size": 8, "residual_length": 8},
                 "polarquant": {}}


def states(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype)


def cache_call(method: str, updates: list[tuple[Any, Any, Any]]) -> Callable[[Path], Any]:
    def call(tmp: Path) -> Any:
        cache = build_cache(method, SHAPE, **CACHE_METHODS[method])
        for keys, values, layer in updates:
            out = cache.update(keys, values, layer)
        return out
    return call


GOOD = states(1, 2, 5, 16)
for method in CACHE_METHODS:
    area = "KV cache layers"
    for label, updates, pattern in [
        ("int64 keys", [(GOOD.long(), GOOD, 0)], r"layer 0: key_states must be float16.*integer tensor"),
        ("int64 values", [(GOOD, GOOD.long(), 0)], r"layer 0: value_states must be float16.*integer tensor"),
        ("bool keys", [(GOOD > 0, GOOD, 0)], "key_states must be float16.*bool tensor"),
        ("complex keys", [(GOOD.to(torch.complex64), GOOD, 0)], "key_states must be float16.*complex tensor"),
        ("numpy keys", [(GOOD.numpy(), GOOD, 0)], "key_states must be a torch.Tensor"),
        ("3-D states", [(GOOD[0], GOOD[0], 0)], "expected key/value states of equal shape"),
        ("value head_dim 8 ≠ keys' 16", [(GOOD, GOOD[..., :8], 0)], "expected key/value states of equal shape"),
        ("head_dim 8, the model's 16", [(GOOD[..., :8], GOOD[..., :8], 0)], "head_dim 8 differs from the model's 16"),
        ("head_dim 16 then 8", [(GOOD, GOOD, 0), (GOOD[..., :8], GOOD[..., :8], 0)],
         "head_dim changed from 16 to 8 between updates"),
        ("batch 1 then 2", [(GOOD, GOOD, 0), (torch.cat([GOOD, GOOD]), torch.cat([GOOD, GOOD]), 0)],
         r"batch/heads changed from \(1, 2\) to \(2, 2\)"),
        ("layer_idx 2 of 2", [(GOOD, GOOD, 2)], r"layer_idx \(this cache has 2 layers\) must be an integer in \[0, 1\]"),
        ("layer_idx -1", [(GOOD, GOOD, -1)], r"layer_idx .* must be an integer in \[0, 1\]"),
        ("layer_idx 1.0", [(GOOD, GOOD, 1.0)], r"layer_idx .* must be an integer"),
        ("layer_idx None", [(GOOD, GOOD, None)], r"layer_idx .* must be an integer"),
        ("layer_idx True", [(GOOD, GOOD, True)], r"layer_idx .* must be an integer"),
    ]:
        error(area, f"{method}: {label}", cache_call(method, updates), pattern)
    ok(area, f"{method}: layer_idx np.int64(1), bfloat16 states",
       cache_call(method, [(GOOD.bfloat16(), GOOD.bfloat16(), np.int64(1))]),
       lambda out: out[0].dtype == torch.bfloat16 and out[0].shape == (1, 2, 5, 16))
error("KV cache layers", "build_cache('turboquant', seed=2.7), then update",
      lambda tmp: build_cache("turboquant", SHAPE, bits=3, seed=2.7).update(GOOD, GOOD, 0), rf"seed {INTEGER}")
for options, pattern in [
    (dict(bits=3, rotation="dct"), "rotation must be one of"),
    (dict(key_bits=True, value_bits=2), "key_bits must be an integer"),
]:
    error("KV cache layers", f"build_cache('turboquant', {options})",
          lambda tmp, o=options: build_cache("turboquant", SHAPE, **o), pattern)
error("KV cache layers", "build_cache('nonesuch')", lambda tmp: build_cache("nonesuch", SHAPE),
      "unknown KV cache method")


# ----------------------------------------------------------------------------------------------- result store
CONFIG = {"experiment": {"name": "toy"}, "dataset": {"name": "toy_data"}, "scale": {"name": "quick"}, "seed": 0}
UNITS = [{"method": "mse", "bits": bits} for bits in (1, 2, 3)]


def empty_store(tmp: Path) -> ResultStore:
    return ResultStore(tmp, "toy", CONFIG)


def filled_store(tmp: Path) -> ResultStore:
    store = empty_store(tmp)
    for unit in UNITS:
        store.save_unit(unit, [{"metric": "d_mse", "value": 0.01485 * unit["bits"], "n": 3},
                               {"metric": "d_prod", "value": 0.25 / unit["bits"], "n": 3}])
    return store


def edit_csv(edit: Callable[[str], str], action: Callable[[ResultStore], Any]) -> Callable[[Path], Any]:
    def call(tmp: Path) -> Any:
        store = filled_store(tmp)
        store.csv_path.write_text(edit(store.csv_path.read_text()))
        return action(ResultStore(tmp, "toy", CONFIG))
    return call


def cut_after(marker: str, occurrence: int = -1) -> Callable[[str], str]:
    """The text cut right after the ``occurrence``-th ``marker``."""
    def edit(text: str) -> str:
        starts = [m.end() for m in re.finditer(re.escape(marker), text)]
        return text[: starts[occurrence]]
    return edit


def done_units(store: ResultStore) -> list[bool]:
    return [store.is_done(unit) for unit in UNITS]


def resumed(store: ResultStore) -> tuple[list[bool], list[bool], int, list[float]]:
    """(done before, done after re-saving the units not done, rows in the frame, values)."""
    before = done_units(store)
    for unit, done in zip(UNITS, before):
        if not done:
            store.save_unit(unit, [{"metric": "d_mse", "value": 0.01485 * unit["bits"], "n": 3},
                                   {"metric": "d_prod", "value": 0.25 / unit["bits"], "n": 3}])
    frame = store.frame()
    return before, done_units(store), len(frame), sorted(frame["value"].round(8))


EXPECTED_VALUES = sorted(round(v, 8) for bits in (1, 2, 3) for v in (0.01485 * bits, 0.25 / bits))


def recomputed(damaged_unit: int) -> Callable[[tuple], bool]:
    def check(result: tuple) -> bool:
        before, after, rows, values = result
        return (before == [i != damaged_unit for i in range(3)] and after == [True] * 3 and rows == 6
                and values == EXPECTED_VALUES)
    return check


def edit_line(index: int, change: Callable[[str], str]) -> Callable[[str], str]:
    """The text with line ``index`` (0: the header) changed."""
    def edit(text: str) -> str:
        lines = text.splitlines()
        lines[index] = change(lines[index])
        return "\n".join(lines) + "\n"
    return edit


# line 1 is the header, units 1, 2, 3 hold lines 2-3, 4-5, 6-7; edits hit unit 3's last row unless stated
ROW_DAMAGE: dict[str, tuple[Callable[[str], str], int]] = {
    "last row cut after its unit_id": (lambda t: t[: t.rindex("\n", 0, -1) + 1]
                                       + ",".join(t.split("\n")[-2].split(",")[:6]), 2),
    "last row's value cut to 0.01 (no line end)": (lambda t: t[: t.rindex("0.08")] + "0.0", 2),
    "last row cut mid-way, with a line end": (lambda t: t[: t.rindex(",d_prod") + 3] + "\n", 2),
    "last row without its last field": (edit_line(-1, lambda line: line.rsplit(",", 1)[0]), 2),
    "middle row without a field": (edit_line(3, lambda line: line.rsplit(",", 1)[0]), 1),
    "middle row with an extra field": (edit_line(2, lambda line: line + ",9"), 0),
    "a text cell in the value column": (lambda t: t.replace("0.01485,", "oops,", 1), 0),
    "a text cell in the n column": (edit_line(4, lambda line: line[:-1] + "three"), 1),
    "a blank line in the middle": (lambda t: t.replace("\n", "\n\n", 3).replace("\n\n", "\n", 2), -1),
}
for label, (edit, unit_index) in ROW_DAMAGE.items():
    if unit_index < 0:
        ok("result store", f"results.csv: {label}", edit_csv(edit, resumed),
           lambda r: r[0] == [True] * 3 and r[2] == 6)
    else:
        recover("result store", f"results.csv: {label}", edit_csv(edit, resumed),
                r"{tmp}/toy/results.csv: damaged rows \(line \d+ ", recomputed(unit_index))
for label, edit in {
    "a row duplicated": lambda t: t + t.splitlines()[3] + "\n",
    "the whole file appended to itself": lambda t: t + "".join(t.splitlines(True)[1:]),
    "a unit's rows copied to the end": lambda t: t + "".join(t.splitlines(True)[1:3]),
}.items():
    for action_name, action in (("is_done", done_units), ("frame", lambda s: s.frame()),
                                ("save_unit", lambda s: s.save_unit({"bits": 9}, [{"value": 1.0}]))):
        error("result store", f"results.csv: {label}, then {action_name}", edit_csv(edit, action),
              r"{tmp}/toy/results.csv: lines \[[\d, ]+\] are duplicated rows")
for label, edit, pattern in [
    ("binary garbage", None, r"{tmp}/toy/results.csv: not a readable results file"),
    ("a NUL byte", lambda t: t.replace("mse", "m\0se", 1), r"{tmp}/toy/results.csv: not a readable CSV file"),
    ("a header without unit_id", lambda t: t.replace("unit_id", "unit", 1), r"{tmp}/toy/results.csv: the header must"),
    ("a header naming a column twice", lambda t: t.replace("metric", "value", 1),
     r"{tmp}/toy/results.csv: the header must"),
]:
    def garbage(tmp: Path, edit=edit) -> Any:
        store = filled_store(tmp)
        if edit is None:
            store.csv_path.write_bytes(b"\xff\xfe\x00garbage\x80\x81")
        else:
            store.csv_path.write_text(edit(store.csv_path.read_text()))
        return store.is_done(UNITS[0])
    error("result store", f"results.csv: {label}", garbage, pattern)
ok("result store", "results.csv: a 0-byte file (nothing done)", edit_csv(lambda t: "", done_units),
   lambda done: done == [False] * 3)


def run_record_damage(content: bytes) -> Callable[[Path], Any]:
    def call(tmp: Path) -> Any:
        store = filled_store(tmp)
        store.run_path.write_bytes(content)
        return ResultStore(tmp, "toy", CONFIG)
    return call


for label, content in [("truncated JSON", b'{"experiment": "toy", "con'), ("empty", b""), ("a JSON list", b"[1, 2]"),
                       ("binary", b"\xff\xfe\x00\x01"), ("not JSON", b"experiment: toy\n")]:
    error("result store", f"run record: {label}", run_record_damage(content),
          r"{tmp}/toy/runs/\w+\.json: (not a readable JSON run record|a run record must be a JSON object)")
for label, call, pattern in [
    ("experiment name '../x'", lambda tmp: ResultStore(tmp, "../x", CONFIG), "experiment name"),
    ("experiment name ''", lambda tmp: ResultStore(tmp, "", CONFIG), "experiment name"),
    ("experiment name 'a b'", lambda tmp: ResultStore(tmp, "a b", CONFIG), "experiment name"),
    ("config a list", lambda tmp: ResultStore(tmp, "toy", [1, 2]), "config must be a DictConfig or a mapping"),
    ("config None", lambda tmp: ResultStore(tmp, "toy", None), "config must be a DictConfig or a mapping"),
    ("result key not in config", lambda tmp: ResultStore(tmp, "toy", CONFIG, ("no.such",)), "not in the config"),
    ("empty unit", lambda tmp: ResultStore(tmp, "toy", CONFIG).is_done({}), "non-empty mapping"),
    ("unit a list", lambda tmp: ResultStore(tmp, "toy", CONFIG).is_done(["bits"]), "non-empty mapping"),
    ("unit key clashing with a store column", lambda tmp: empty_store(tmp).save_unit({"seed": 1}, [{"v": 1}]), "clash"),
    ("no rows", lambda tmp: empty_store(tmp).save_unit({"bits": 1}, []), "no rows"),
    ("a row contradicting its unit", lambda tmp: empty_store(tmp).save_unit({"bits": 1}, [{"bits": 2}]), "contradict"),
    ("two identical rows", lambda tmp: empty_store(tmp).save_unit({"bits": 1}, [{"v": 1.0}, {"v": 1.0}]),
     "rows \\[0, 1\\] are identical"),
    ("a text value in a numeric column",
     lambda tmp: filled_store(tmp).save_unit({"bits": 7}, [{"metric": "x", "value": "n/a", "n": 3}]),
     "would read back damaged: line \\d+ holds 'n/a' in the numeric column 'value'"),
]:
    error("result store", label, call, pattern)


def stale_temp_and_mode(tmp: Path) -> tuple[list[str], int, int]:
    store = ResultStore(tmp, "toy", CONFIG)
    stale = store.directory / ".results.csv.abc123.tmp"  # what a writer killed before its rename leaves
    stale.write_text("half a file")
    store.save_unit({"bits": 1}, [{"value": 1.0}])
    mask = os.umask(0)
    os.umask(mask)
    files = [store.csv_path, store.run_path, store.directory / "config.json"]
    modes = {p.stat().st_mode & 0o777 for p in files}
    return sorted(p.name for p in store.directory.glob(".*.tmp")), modes, 0o666 & ~mask


ok("result store", "a killed writer's temp file is removed; files get 0666 & ~umask", stale_temp_and_mode,
   lambda result: result[0] == [] and result[1] == {result[2]})


# ----------------------------------------------------------------------------------------------- the tests
def test_at_least_200_cases() -> None:
    assert len(CASES) >= 200
    assert len({(case.area, case.name) for case in CASES}) == len(CASES), "case names must be unique"


@pytest.mark.parametrize("case", CASES, ids=[f"{case.area}: {case.name}" for case in CASES])
def test_case(case: Case, tmp_path: Path) -> None:
    verdict, what = outcome(case, tmp_path)
    assert verdict == ("correct" if case.kind == "ok" else "clear"), what


def tally() -> dict[str, collections.Counter]:
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for case in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            verdict, what = outcome(case, Path(tmp))
        counts[case.area][verdict] += 1
        if verdict in ("unhelpful", "silent"):
            print(f"  {verdict:9s} {case.area}: {case.name}: {what[:160]}")
    return counts


if __name__ == "__main__":
    totals: collections.Counter = collections.Counter()
    for area, counts in tally().items():
        totals.update(counts)
        print(f"{area:22s} " + ", ".join(f"{k} {counts[k]}" for k in ("clear", "correct", "unhelpful", "silent")))
    print(f"{'all ' + str(sum(totals.values())) + ' cases':22s} "
          + ", ".join(f"{k} {totals[k]}" for k in ("clear", "correct", "unhelpful", "silent")))
    sys.exit(0)
