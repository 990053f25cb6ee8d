"""One figure style for every experiment, and saving as PNG + PDF."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")  # figures are files; never open a window

import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["STYLE", "METHOD_COLORS", "figure_style", "save_figure", "figure_title"]

if TYPE_CHECKING:
    from experiments.coverage import GridCoverage

#: Shared rcParams: readable at column width in a paper, consistent across experiments.
STYLE: dict[str, object] = {
    "figure.dpi": 110,
    "savefig.dpi": 150,
    "savefig.bbox": "tight",
    "font.size": 9,
    "axes.titlesize": 9,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 1.5,
    "lines.markersize": 4,
    "legend.frameon": False,
}

#: One colour per method name (the config's ``methods`` entries), the same in every figure.
METHOD_COLORS: dict[str, str] = {
    "mse": "#1f77b4",  # TurboQuant_mse
    "prod": "#d62728",  # TurboQuant_prod
    "qjl": "#9467bd",
    "bound": "#444444",
}


@contextmanager
def figure_style() -> Iterator[None]:
    """Context in which figures are drawn with the shared style."""
    with plt.rc_context(STYLE):
        yield


def figure_title(what: str, provenance: Mapping[str, Any], width: int = 110) -> str:
    """A title naming what is plotted and the data actually used (and any substitution).

    ``provenance`` is what the experiment recorded with ``store.record_provenance`` (it reaches
    ``plot`` as ``df.attrs["provenance"]``): ``description`` (or ``dataset``) and ``substitution``
    (wrapped at ``width`` characters).
    """
    used = provenance.get("description") or provenance.get("dataset")
    if not used:
        raise ValueError("provenance names no data: record_provenance(description=..., ...) before plotting")
    title = f"{what}\n{used}"
    if provenance.get("substitution"):
        title += "\n" + textwrap.fill(f"substitution: {provenance['substitution']}", width=width)
    return title


def _safe_name(name: str) -> str:
    if not name:
        raise ValueError("figure name must be non-empty")
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", name)


def save_figure(
    fig: matplotlib.figure.Figure, figures_dir: str | Path, name: str, coverage: GridCoverage | None = None
) -> list[Path]:
    """Write ``fig`` as ``<figures_dir>/<name>.png`` and ``.pdf``; close it; return both paths.

    ``coverage`` (:func:`experiments.coverage.grid_coverage` of the run's config) labels a run that left
    out part of its config's grid: the files become ``<name>_partial.*`` and the title says what was
    left out, so a reduced run never overwrites the figure of a full one. Every experiment's ``plot``
    passes it.
    """
    if coverage is not None and not coverage.full:
        name = coverage.stem(name)
        fig.suptitle(coverage.title(fig.get_suptitle()), color="#b00000")
    directory = Path(figures_dir)
    directory.mkdir(parents=True, exist_ok=True)
    stem = _safe_name(name)
    paths = [directory / f"{stem}.png", directory / f"{stem}.pdf"]
    for path in paths:  # no creation date in the PDF: the same rows give the same bytes (make check rebuilds some)
        fig.savefig(path, metadata={"CreationDate": None} if path.suffix == ".pdf" else None)
    plt.close(fig)
    return paths
