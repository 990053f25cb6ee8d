"""Needle-in-a-haystack with compressed KV caches (paper Fig. 4, arXiv v1).

Protocol (Kamradt's test as used by Fu et al. 2024 and the KV-cache papers):

1. Haystack: Paul Graham's essays (:mod:`experiments.data.haystack`), tokenized once with the model's
   tokenizer (repeated when a context is longer than the essays) and cut at the token where the whole chat
   prompt (system turn, haystack with the needle, question) is exactly ``context`` tokens long, as in
   Kamradt's test, which cuts its context by tokens.
2. Needle: "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny
   day." inserted as tokens at *depth* p: at the last sentence boundary at or before haystack token
   ``round(p * n)`` (p = 0: before the first sentence, p = 1: at the end). The depth actually reached
   (haystack tokens before the needle / all haystack tokens) is recorded per cell. Every prompt of a context
   has the same length, so the depths of one (method, seed, context) run as one batch (``batch_size`` rows at a
   time, a size of the scale; a batch row's cache is the cache that prompt alone would build).
3. The prompt (chat template) is prefilled into a fresh cache of the method, the answer decoded greedily;
   the cache's memory is recorded at the end, at its peak and averaged over forward passes, and a
   ``memory_ratio`` budget is enforced at the peak (:mod:`experiments.kv_generation`). With
   ``experiment.answer_logprob`` each cell also records the teacher-forced log-probability of the full
   cache's answer under the method's cache (a score that separates settings before the answers differ).
4. Score in [0, 1]: the needle's *answer words* (its content words that are not in the question:
   eat, sandwich, sit, dolores, park, sunny, day) found in the answer, as a fraction: ROUGE-1 recall of
   the answer words, case- and punctuation-insensitive, words compared after a light suffix stemmer
   (:func:`stem`, so "eating ... sitting" counts like "eat ... sit", as ROUGE with ``use_stemmer``).
   A verbatim answer scores 1, "eat a sandwich" 2/7, a wrong or empty answer 0. Repeating the question
   earns nothing. The score is a pure function of the stored answer, so :func:`run` re-scores stored
   cells whenever the scorer changes, without running the model again.

One unit of the :class:`~experiments.io.ResultStore` is one ``(method, options, context, depth)`` cell, so
a killed run resumes cell by cell. Methods that draw random state (TurboQuant's rotation, PolarQuant's)
run once per seed in ``experiment.method_seeds``; their scores are averaged over seeds and the spread
across seeds is reported (one rotation is one draw of the quantizer, and on a small model the score
depends on the draw). Every method runs at the same memory budget (``experiment.memory_ratio``,
25% of the 16-bit cache as in the paper); each cell records the cache's measured bytes and ratio.

``python run.py experiment=needle``. Modules: ``scoring`` (the answer-word score), ``prompts`` (task, haystack cut,
needle insertion), ``experiment`` (run: cells, batches, the store), ``table`` (summary table, paper comparison),
``figure`` (the heatmaps).
"""


from experiments.needle.experiment import PROTOCOL, RESULT_KEYS, method_runs, run, run_batch, stored_frame, unit_of
from experiments.needle.figure import plot
from experiments.needle.prompts import NeedlePrompt, NeedleTask, PromptBuilder, sentence_starts
from experiments.needle.scoring import answer_words, needle_score, stem
from experiments.needle.table import cell_standard_error, paper_comparison, seed_spread, summary_table, write_tables

__all__ = [
    "PROTOCOL", "RESULT_KEYS", "NeedlePrompt", "NeedleTask", "PromptBuilder", "answer_words", "cell_standard_error",
    "method_runs", "needle_score", "paper_comparison", "plot", "run", "run_batch", "seed_spread", "sentence_starts",
    "stem", "stored_frame", "summary_table", "unit_of", "write_tables",
]
