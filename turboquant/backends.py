"""Which implementation serves a configuration, and why the others cannot: the one capability table.

Four choices of implementation exist in the library, and each is made here and nowhere else. Every function
returns a :class:`Choice`: the candidate that serves, and for each candidate passed over the reason.

==================  ================================  =====================================================
choice              candidates, in order              asked by
==================  ================================  =====================================================
quantizer backend   triton, numba, torch              TurboQuantMSE / TurboQuantProd (encode and
                                                      inner_product), and through them the ANN index and the
                                                      KV cache's streams
ANN search path     device, fastscan, lut, dense      TurboQuantIndex (which scorer reads the stored codes)
decode read path    fused, workspace                  TurboQuantCache's layers (attention straight from the
                                                      packed codes, or over a decoded workspace)
decode kernel       mma, tiles                        the fused read path's split kernel
                                                      (``decode_attention_groups_triton``)
==================  ================================  =====================================================

A requested candidate that cannot serve raises ``ValueError`` with its reason; ``"auto"`` takes the first that
can. Every candidate computes the same quantity: the Triton and numba encoders return the torch reference's codes
except for coordinates within fp16 / float32 rounding of a Lloyd-Max midpoint (Eq. 4's boundaries), and the
fused decode kernel computes the workspace path's attention to float32 rounding.

``python -m turboquant`` prints the table for this machine (:func:`capability_table`).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["DECODE_KERNELS", "FUSED_DECODE_CHOICES", "KERNEL_BITS", "QUANTIZE_KERNELS", "QUANTIZER_BACKENDS", "Choice",
           "KernelStream", "ann_search_path", "capability_table", "check_fused_decode", "decode_kernel",
           "decode_read_path", "fastscan_layout", "gluon_unavailable", "lut_layout", "numba_available",
           "quantize_kernel", "quantizer_backend", "triton_available", "triton_unavailable"]

#: Code widths the Triton kernels read and write (``turboquant.kernels._layout``: lcm(b, 8)-bit groups).
KERNEL_BITS = (1, 2, 3, 4)
#: The fused TurboQuant_prod quantize kernel holds one row in one tile.
PROD_KERNEL_MAX_DIM = 256
QUANTIZER_BACKENDS = ("auto", "torch", "triton", "numba")
FUSED_DECODE_CHOICES = (False, True, "auto")
ANN_SCORERS = ("auto", "dense", "lut", "fastscan")
DECODE_KERNELS = ("auto", "mma", "tiles")
QUANTIZE_KERNELS = ("auto", "wgmma", "tiles")


@dataclass(frozen=True)
class Choice:
    """The candidate that serves one configuration, and why each other candidate does not."""

    decision: str
    chosen: str
    passed_over: tuple[tuple[str, str], ...] = ()  # (candidate, reason), in the order of preference

    def why_not(self, candidate: str) -> str | None:
        """The reason ``candidate`` does not serve, or None when it is the one chosen."""
        if candidate == self.chosen:
            return None
        for name, reason in self.passed_over:
            if name == candidate:
                return reason
        raise KeyError(f"{candidate!r} is not a candidate of the {self.decision} (chosen: {self.chosen!r}, others: "
                       f"{[name for name, _ in self.passed_over]})")

    def __str__(self) -> str:
        others = "; ".join(f"{name}: {reason}" for name, reason in self.passed_over)
        return f"{self.decision}: {self.chosen}" + (f" ({others})" if others else "")


def triton_available(device: torch.device | str) -> bool:
    """True when the Triton kernels can run on tensors of ``device`` (CUDA with Triton installed, or any device
    under ``TRITON_INTERPRET=1``, Triton's CPU interpreter, which the tests use)."""
    if importlib.util.find_spec("triton") is None:
        return False
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    return torch.device(device).type == "cuda" and torch.cuda.is_available()


def numba_available() -> bool:
    """True when the numba CPU encoder (``turboquant.kernels.quantize_cpu``) can be compiled."""
    return importlib.util.find_spec("numba") is not None


def triton_unavailable(device: torch.device | str) -> str | None:
    """Why no Triton kernel runs on ``device``, or None when one does (:func:`triton_available`)."""
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed"
    if not triton_available(device):
        return f"no Triton kernel runs on {device} (a CUDA device, or TRITON_INTERPRET=1)"
    return None


def gluon_unavailable(device: torch.device | str) -> str | None:
    """Why no Gluon kernel (Triton's layout-explicit dialect, GPU only: no interpreter) runs on ``device``, or None."""
    reason = triton_unavailable(device)
    if reason is None and torch.device(device).type != "cuda":
        reason = "Gluon kernels run on a CUDA GPU only (the Triton interpreter does not run them)"
    if reason is None and importlib.util.find_spec("triton.experimental.gluon") is None:
        reason = "this Triton has no Gluon (triton.experimental.gluon)"
    return reason


def lut_layout(stage_bits: Sequence[int]) -> bool:
    """Whether byte lookup tables can score codes of these stage widths (each divides 8: whole codes per byte)."""
    return all(8 % bits == 0 for bits in stage_bits)


def fastscan_layout(stage_bits: Sequence[int]) -> bool:
    """Whether the stages' bits per coordinate divide 4, the width of a fast-scan sub-quantizer code."""
    return 4 % sum(stage_bits) == 0


def _decide(decision: str, requested: str | None, reasons: dict[str, str | None], asked: str) -> Choice:
    """The ``requested`` candidate (ValueError naming ``asked`` and the reason if it cannot serve), or with
    ``requested=None`` ("auto") the first in ``reasons``' order whose reason is None."""
    if requested is None:
        chosen = next(name for name, reason in reasons.items() if reason is None)
    elif reasons[requested] is not None:
        raise ValueError(f"{asked} cannot serve this configuration: {reasons[requested]}")
    else:
        chosen = requested
    unused = f"{chosen} comes first" if requested is None else f"not asked for ({asked})"
    passed = tuple((name, reason if reason is not None else unused) for name, reason in reasons.items()
                   if name != chosen)
    return Choice(decision, chosen, passed)


def quantizer_backend(requested: str, device: torch.device | str, *, mse_bits: int, dim: int,
                      prod: bool = False) -> Choice:
    """The backend of a TurboQuant_mse (``prod=False``, ``mse_bits`` = b) or TurboQuant_prod (``mse_bits`` = b − 1)
    quantizer of dimension ``dim`` on ``device``.

    ``"auto"`` takes the Triton kernels on CUDA devices (never the CPU interpreter, which only ``"triton"``
    reaches), else the numba encoder on the CPU when numba is installed, else torch (the exact reference, which
    serves everything). The numba encoder is the MSE stage's, so it never serves TurboQuant_prod at b = 1.
    """
    if requested not in QUANTIZER_BACKENDS:
        raise ValueError(f"backend must be one of {QUANTIZER_BACKENDS}, got {requested!r}")
    device = torch.device(device)
    triton = triton_unavailable(device)
    if triton is None and mse_bits > KERNEL_BITS[-1]:
        triton = f"the kernels' codes are {KERNEL_BITS[0]}-{KERNEL_BITS[-1]} bits, this quantizer's {mse_bits}"
    if triton is None and prod and dim > PROD_KERNEL_MAX_DIM:
        triton = f"the TurboQuant_prod kernel takes dim <= {PROD_KERNEL_MAX_DIM}, got {dim}"
    if triton is None and requested == "auto" and device.type != "cuda":
        triton = "backend='auto' takes Triton on CUDA devices only (the CPU interpreter: backend='triton')"
    numba = None
    if not numba_available():
        numba = "the numba package is not installed (pip install numba)"
    elif device.type != "cpu":
        numba = f"the numba encoder runs on the CPU, got device {device}"
    elif prod and mse_bits == 0:
        numba = "the numba encoder encodes the MSE stage, which TurboQuant_prod at bits=1 does not have"
    return _decide("quantizer backend", None if requested == "auto" else requested,
                   {"triton": triton, "numba": numba, "torch": None}, f"backend={requested!r}")


def ann_search_path(scorer: str, device: torch.device | str, quantizer: str, stage_bits: Sequence[int]) -> Choice:
    """How an ANN index with codes on ``device`` scores its queries, given the quantizer's backend and the code
    width of each score stage (TurboQuant_mse: [b]; TurboQuant_prod: [b − 1, 1]).

    Codes on a GPU, or a Triton quantizer, are scored by the quantizer's ``inner_product`` (``"device"``) whatever
    ``scorer`` asks. On the CPU: ``"lut"`` needs code widths dividing 8 (whole codes per byte), ``"fastscan"`` faiss
    and bits per coordinate dividing 4 (the 4-bit fast-scan sub-quantizer), ``"dense"`` serves everything;
    ``"auto"`` takes fast-scan where it exists, else dense.
    """
    if scorer not in ANN_SCORERS:
        raise ValueError(f"scorer must be one of {ANN_SCORERS}, got {scorer!r}")
    device = torch.device(device)
    if device.type != "cpu" or quantizer == "triton":
        where = f"codes on {device}" if device.type != "cpu" else "the quantizer's backend is Triton"
        return Choice("ANN search path", "device", tuple((name, f"{where}: the quantizer's kernels score them")
                                                         for name in ("fastscan", "lut", "dense")))
    lut = None if lut_layout(stage_bits) else \
        f"scorer='lut' needs code widths dividing 8, got {list(stage_bits)} bits"
    if scorer == "auto" and lut is None:
        lut = "scorer='auto' takes fast-scan where it exists, else dense"
    fastscan = None
    if importlib.util.find_spec("faiss") is None:
        fastscan = "scorer='fastscan' needs faiss (pip install faiss-cpu)"
    elif not fastscan_layout(stage_bits):
        fastscan = (f"scorer='fastscan' needs bits per coordinate dividing 4 (mse: 1, 2, 4; prod: 2, 4), got "
                    f"{sum(stage_bits)}")
    reasons = {"device": "the codes are on the CPU and the quantizer's backend is not Triton",
               "fastscan": fastscan, "lut": lut, "dense": None}
    return _decide("ANN search path", None if scorer == "auto" else scorer, reasons, f"scorer={scorer!r}")


@dataclass(frozen=True)
class KernelStream:
    """One stored stream of a KV-cache layer as the decode kernel would read it: its name ("key", "value",
    "outlier_key", "outlier_value"), ``format`` ("turboquant" for Lloyd-Max codes; else e.g. "fp8", "uniform"), its
    bits per coordinate, and whether one of them is a QJL sign (TurboQuant_prod keys store ``bits - 1``-bit MSE
    codes and 1-bit signs)."""

    name: str
    format: str
    bits: int
    qjl: bool = False


def check_fused_decode(value: bool | str) -> None:
    """ValueError unless ``value`` is one of :data:`FUSED_DECODE_CHOICES` (``1`` is not ``True``)."""
    if value not in FUSED_DECODE_CHOICES or not isinstance(value, (bool, str)):
        raise ValueError(f"fused_decode must be one of {FUSED_DECODE_CHOICES}, got {value!r}")


def decode_read_path(requested: bool | str, device: torch.device | str | None,
                     streams: Sequence[KernelStream]) -> Choice:
    """Whether decode attention reads the packed codes in the Triton kernel (``"fused"``) or a decoded
    workspace, for a layer storing ``streams`` on ``device`` (None: the device is not known yet; only the
    configuration is judged).

    ``requested``: True (fused; ValueError if it cannot serve), False (the workspace) or ``"auto"``. The kernel
    reads TurboQuant codes of 1-4 bits (Alg. 1's, or Alg. 2's MSE stage beside its QJL signs).
    """
    check_fused_decode(requested)
    fused = None if device is None else triton_unavailable(device)
    others = [s for s in streams if s.format != "turboquant"]
    if fused is None and others:
        fused = (", ".join(f"{s.name}_format={s.format!r}" for s in others)
                 + ": the decode kernel reads TurboQuant codes only")
    for stream in streams:
        mse_bits = stream.bits - int(stream.qjl)
        if fused is None and mse_bits > KERNEL_BITS[-1]:
            stored = f" ({mse_bits}-bit MSE codes + QJL signs)" if stream.qjl else ""
            fused = (f"{stream.name}_bits={stream.bits}{stored}: the decode kernel reads MSE codes of "
                     f"{KERNEL_BITS[0]}-{KERNEL_BITS[-1]} bits")
    wanted = {True: "fused", False: "workspace", "auto": None}[requested]
    return _decide("decode read path", wanted, {"fused": fused, "workspace": None}, f"fused_decode={requested!r}")


def decode_kernel(requested: str, device: torch.device | str | None, layout: str | None) -> Choice:
    """The split kernel of fused decode attention: ``"mma"`` (Gluon: the decoded codes are the register operands of
    ``mma.sync``; the fastest measured, ``benchmarks/NOTES.md`` session 16) where it runs and reads the cache's
    layout, else ``"tiles"`` (every layout, the interpreter too). ``layout``: why the mma kernel cannot read this
    cache (``CacheFormat.mma_unsupported``), None if it can; ``device`` None: judged by the layout alone."""
    return _gluon_or_tiles("decode kernel", DECODE_KERNELS, requested, device, layout)


def quantize_kernel(requested: str, device: torch.device | str | None, layout: str | None) -> Choice:
    """The kernel of ``quantize_mse_triton`` and ``quantize_prod_triton``: ``"wgmma"`` (Gluon, Hopper: the rotation as
    the shared-memory operand of the warpgroup MMA, codes packed from the accumulator; ``benchmarks/NOTES.md``
    sessions 17-18) where it runs and reads the rows, else ``"tiles"`` (every shape and width, the interpreter too). ``layout``: why the wgmma kernel
    cannot read these rows (``quantize_wgmma.wgmma_quantize_unsupported``), None if it can; ``device`` None: judged
    by the rows alone."""
    return _gluon_or_tiles("quantize kernel", QUANTIZE_KERNELS, requested, device, layout)


def _gluon_or_tiles(decision: str, kernels: tuple[str, str, str], requested: str, device: torch.device | str | None,
                    layout: str | None) -> Choice:
    """A kernel choice of ``kernels`` = ("auto", Gluon kernel, "tiles"): the Gluon kernel unless Gluon cannot run on
    ``device`` (not judged when None) or ``layout`` says why it cannot read the data."""
    if requested not in kernels:
        raise ValueError(f"kernel must be one of {kernels}, got {requested!r}")
    gluon = (None if device is None else gluon_unavailable(device)) or layout
    return _decide(decision, None if requested == "auto" else requested, {kernels[1]: gluon, "tiles": None},
                   f"kernel={requested!r}")


def capability_table(device: torch.device | str) -> str:
    """The table for ``device``: every quantizer at d = 128 under ``backend="auto"``, the decode read path of K/V
    caches of 2-5 bits judged by their configuration alone (the device's part is the first line), and the fused
    path's split kernel for a one-group 4-bit cache at head_dim 128 on ``device``, and the quantize kernel of fp16
    rows of 128 channels there."""
    device = torch.device(device)
    lines = [f"device {device}: Triton kernels {'run' if triton_available(device) else 'do not run'} here; "
             f"numba {'installed' if numba_available() else 'not installed'}"]
    for prod in (False, True):
        for bits in range(2 if prod else 1, 9):
            name = f"TurboQuant{'Prod' if prod else 'MSE'}(bits={bits})"
            lines.append(f"  {name:<24} {quantizer_backend('auto', device, mse_bits=bits - prod, dim=128, prod=prod)}")
    for bits in (2, 3, 4, 5):
        streams = [KernelStream("key", "turboquant", bits), KernelStream("value", "turboquant", bits)]
        lines.append(f"  {f'K{bits}/V{bits} cache':<24} {decode_read_path('auto', None, streams)}")
    lines.append(f"  {'K4/V4 d=128 kernel':<24} {decode_kernel('auto', device, None)}")
    lines.append(f"  {'quantize fp16 d=128':<24} {quantize_kernel('auto', device, None)}")
    return "\n".join(lines)
