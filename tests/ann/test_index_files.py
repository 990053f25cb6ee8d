"""Corrupted, edited and inconsistent index files fail on load with an IndexFileError naming the file."""

import json
import zipfile

import numpy as np
import pytest

from turboquant.ann import IndexFileError, TurboQuantIndex, load_index, make_index
from turboquant.ann.index_file import read_index_file, write_index_file


@pytest.fixture()
def saved(tmp_path):
    rng = np.random.default_rng(0)
    index = TurboQuantIndex(32, 4, variant="prod", seed=4)
    index.add(rng.standard_normal((50, 32)).astype(np.float32))
    return index, index.save(tmp_path / "index.npz")


def _rewrite(path, meta=None, **changes):
    """Rewrite ``path`` with changed metadata / arrays and a *valid* checksum (a crafted file)."""
    old_meta, arrays = read_index_file(path)
    arrays.update(changes)
    arrays = {key: value for key, value in arrays.items() if value is not None}
    path.unlink()
    return write_index_file(path, meta or old_meta, arrays)


def _raises(path, message):
    with pytest.raises(IndexFileError, match=message) as caught:
        load_index(path)
    assert str(path) in str(caught.value)


def test_round_trip_still_works(saved):
    index, path = saved
    assert load_index(path).config() == index.config()


@pytest.mark.parametrize("cut", [0, 10, 200, -50])
def test_truncated_or_empty_files(saved, cut):
    _, path = saved
    data = path.read_bytes()
    path.write_bytes(data[:cut] if cut >= 0 else data[:cut])
    _raises(path, "not a readable saved index|checksum")


def test_random_bytes_and_bit_flips(saved, tmp_path):
    _, path = saved
    noise = tmp_path / "noise.npz"
    noise.write_bytes(np.random.default_rng(1).bytes(826))
    _raises(noise, "not a readable saved index")
    data = bytearray(path.read_bytes())
    member = zipfile.ZipFile(path).getinfo("codes.npy")  # flip a byte inside the stored codes themselves
    names = member.header_offset + 26  # local file header: file name and extra field lengths, then both
    lengths = (int.from_bytes(data[at : at + 2], "little") for at in (names, names + 2))
    start = names + 4 + sum(lengths)
    data[start + member.compress_size // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    _raises(path, "not a readable|checksum")


def test_an_edited_seed_fails_the_checksum(saved):
    index, path = saved
    meta, arrays = read_index_file(path)
    meta["config"]["seed"] = 5
    with np.load(path) as original:
        checksum = original["checksum"]
    # the metadata edited, everything else (the old checksum included) as saved
    np.savez(path, meta=np.frombuffer(json.dumps(meta, sort_keys=True).encode(), np.uint8), checksum=checksum, **arrays)
    _raises(path, "checksum mismatch")


def test_nan_norms_and_wrong_shapes_and_dtypes(saved):
    _, path = saved
    _, arrays = read_index_file(path)
    norms = arrays["norms"].copy()
    norms[3] = np.nan
    _raises(_rewrite(path, norms=norms), "NaN")
    _rewrite(path, norms=arrays["norms"], codes=arrays["codes"][:, :-1])
    _raises(path, "'codes' must be uint8 of shape")
    _rewrite(path, codes=arrays["codes"].astype(np.int16))
    _raises(path, "'codes' must be uint8")
    _rewrite(path, codes=arrays["codes"], qjl_signs=None)
    _raises(path, "saves arrays")


def test_a_huge_claimed_dimension_fails_before_anything_is_built(saved):
    """The DoS case: a small file claiming dim 4096 is refused by the shape check, before a 4096² rotation."""
    _, path = saved
    meta, _ = read_index_file(path)
    meta["config"]["dim"] = 4096
    _raises(_rewrite(path, meta), "must be uint8 of shape")
    meta["config"]["dim"] = 10**7
    _raises(_rewrite(path, meta), "at most")
    assert path.stat().st_size < 20_000


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda meta: {**meta, "method": "lsh"}, "unknown method"),
        (lambda meta: {**meta, "config": {**meta["config"], "variant": "fast"}}, "variant"),
        (lambda meta: {**meta, "config": {**meta["config"], "bits": "4"}}, "bits"),
        (lambda meta: {**meta, "config": {**meta["config"], "colour": 1}}, "colour"),
        (lambda meta: {**meta, "is_trained": "yes"}, "is_trained"),
        (lambda meta: {"config": meta["config"]}, "'method' and 'config'"),
        (lambda meta: [1, 2], "'method' and 'config'"),
    ],
)
def test_bad_metadata(saved, edit, message):
    _, path = saved
    meta, _ = read_index_file(path)
    _raises(_rewrite(path, edit(meta)), message)


def test_metadata_that_is_not_json(saved):
    _, path = saved
    _, arrays = read_index_file(path)
    bad = b"{not json"
    from turboquant.ann.index_file import _digest

    np.savez(path, meta=np.frombuffer(bad, np.uint8), checksum=np.frombuffer(_digest(bad, arrays).encode(), np.uint8),
             **arrays)
    _raises(path, "not valid JSON")


def test_foreign_files(tmp_path):
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    _raises(tmp_path / "other.npz", "not a saved index")
    np.save(tmp_path / "bare.npy", np.zeros(3))
    _raises(tmp_path / "bare.npy", "bare .npy")
    with pytest.raises(IndexFileError, match="no saved index"):
        load_index(tmp_path / "missing.npz")


def test_bad_labels_and_faiss_payloads(saved, tmp_path):
    _, path = saved
    _raises(_rewrite(path, labels=np.zeros(50, np.int64)), "distinct")
    pytest.importorskip("faiss")
    exact = make_index("exact", 8)
    exact.add(np.eye(8, dtype=np.float32))
    faiss_path = exact.save(tmp_path / "exact.npz")
    _raises(_rewrite(faiss_path, faiss_index=np.frombuffer(b"garbage!" * 4, np.uint8)), "faiss cannot read")
