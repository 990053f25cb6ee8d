"""scripts/ferry.py: parts sized for the calls, the tree's tables stashed and restored as they were."""

import math
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import ferry  # noqa: E402


@pytest.mark.parametrize("total, size", [(1000, 300), (900, 300), (250, 300), (1, 300)])
def test_parts_cover_the_file_in_the_fewest_calls(total, size):
    sizes = ferry.part_sizes(total, size)
    assert sum(sizes) == total and all(s == size for s in sizes[:-1]) and 0 < sizes[-1] <= size
    assert len(sizes) == math.ceil(total / size)


def test_no_room_is_an_error():
    with pytest.raises(ValueError, match="no room"):
        ferry.part_sizes(100, 0)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def test_shrink_and_restore_leave_the_tree_as_it_was(tmp_path):
    repo = tmp_path / "repo"
    for rel, size in (("results/needle/results.csv", 5000), ("results/needle/runs/a.json", 70),
                      ("figures/fig.png", 3000), ("run.py", 40)):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(b"x" * size)
    (repo / ".gitignore").write_text("/.ferry/\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    full, status = ferry.tree_bytes(repo), _git(repo, "status", "--porcelain")
    assert ferry.shrink(repo) == 8000
    assert ferry.tree_bytes(repo) == full - 8000 and ferry.stashed_bytes(repo) == 8000
    assert not (repo / "results/needle/results.csv").exists() and (repo / "results/needle/runs/a.json").exists()
    (repo / "figures/fig.png").write_bytes(b"new")  # a file made while stashed is not overwritten
    with pytest.raises(SystemExit, match="resolve by hand"):
        ferry.restore(repo)
    (repo / "figures/fig.png").unlink()
    ferry.restore(repo)
    assert ferry.tree_bytes(repo) == full and ferry.stashed_bytes(repo) == 0
    assert _git(repo, "status", "--porcelain") == status
