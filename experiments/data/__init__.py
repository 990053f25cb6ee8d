"""Embedding datasets behind one loader: ``load_embeddings(cfg.dataset, n_base, n_queries, seed)``."""

from experiments.data.embeddings import LOADERS, EmbeddingDataset, load_embeddings

__all__ = ["LOADERS", "EmbeddingDataset", "load_embeddings"]
