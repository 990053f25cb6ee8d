#!/usr/bin/env bash
# One device call of the kernel benchmarks (results/kernels/README.md), everything it returns under $OUT:
#   bash scripts/h200_kernels.sh SET [PYTEST_SELECTION...]
# SET: a configs/kernels_set/ name (e.g. session35, the run). First the GPU kernel tests (default: the Gluon
# kernels' suites and the static store's CUDA-graph tests, not its CPU tests, whose cache= keyword the image's
# transformers 5.17 lacks; or the pytest arguments given), then `python3 run.py experiment=kernels +kernels_set=SET`,
# each under a budget (TEST_SECONDS, RUN_SECONDS) so that a hang still returns what finished. Wheels (hydra-core,
# omegaconf, antlr4, platformdirs; not in the device image) are installed from .whl/ (carry it). $OUT receives gpu.txt
# (GPU, driver, commit), pytest.txt, log.txt, kernels.md, results.csv and the run record (two folders deep at most).
# NCU=1 adds ncu of one launch of each default kernel (benchmarks/ncu_quantize_decode.py: quantize at 4 / 3 / 2 bits,
# prod, scores and decode at B=8/32K) as ncu_kernels.txt, with the stall cycles per issued instruction by reason.
# NCU_EXTRA='ARGS' adds ncu of the launches benchmarks/ncu_quantize_decode.py makes with ARGS (e.g. '--ops decode
# --bits 4 --decoders auto prmt --shapes 1x8192 8x32768'), every kernel of
# each decode (the query's rotation, the split kernel, the merge, the output's rotation), as ncu_extra.txt
# (NCU_EXTRA_SECONDS, default 150).
# RUN_ARGS: more overrides for run.py, e.g. RUN_ARGS='kernels_set.ops=[quantize,prod]' (a set's ops alone).
# ONLY_ON=H200 stops at once (exit 3, before any test or install) where the GPU's name lacks that text: a call that
# names the nvidia-h200 kind may be given an H100, whose timings the kernels have (sessions 21, 24, 28).
set -uo pipefail
set_name=${1:?kernels set (configs/kernels_set/NAME.yaml)}
shift
[ -f "configs/kernels_set/$set_name.yaml" ] || { echo "no configs/kernels_set/$set_name.yaml" >&2; exit 2; }
tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(tests/kernels/test_kernel_mma.py tests/kernels/test_kernel_quantize_wgmma.py
                                 tests/kvcache/test_static_store.py::test_decode_step_replays_in_a_cuda_graph
                                 tests/kvcache/test_static_store.py::test_quantize_in_a_graph_records_extreme_rows)
OUT=${OUT:?the device tool sets OUT}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
if [ -n "${ONLY_ON:-}" ] && [[ "$gpu" != *"$ONLY_ON"* ]]; then
  echo "ONLY_ON=$ONLY_ON: this GPU is ${gpu:-unknown}; nothing run" >&2; exit 3
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheels missing: carry .whl/ (see this script's header)" >&2; exit 2; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; git rev-parse HEAD; } > "$OUT/gpu.txt" 2>&1
if [ "${TEST_SECONDS:-150}" != 0 ]; then  # TEST_SECONDS=0: no tests (a second call on a machine that ran them)
  timeout "${TEST_SECONDS:-150}" python3 -m pytest -v -rfE --tb=short -k "not offline" "${tests[@]}" \
    > "$OUT/pytest.txt" 2>&1
  echo "pytest: exit $?"; tail -3 "$OUT/pytest.txt"
fi
timeout "${RUN_SECONDS:-300}" python3 run.py experiment=kernels "+kernels_set=$set_name" paths.results_dir=/tmp/kr \
  paths.figures_dir=/tmp/kr/figures ${RUN_ARGS:-} > "$OUT/log.txt" 2>&1
echo "run: exit $?"
cp /tmp/kr/kernels/kernels.md /tmp/kr/kernels/results.csv "$OUT/" 2>/dev/null
mkdir -p "$OUT/runs" && cp /tmp/kr/kernels/runs/*.json "$OUT/runs/" 2>/dev/null
grep -E "^\| |FAILED" "$OUT/log.txt" | grep -v "^| op \|^|---" | cut -c1-200 | tail -40
profile() {  # OUTPUT SECONDS KERNEL_REGEX ncu_quantize_decode's arguments...
  local output=$1 seconds=$2 kernels=$3
  shift 3
  source scripts/ncu_args.sh
  timeout "$seconds" ncu "${NCU_ARGS[@]}" -k regex:"$kernels" python3 -m benchmarks.ncu_quantize_decode "$@" \
    > "$OUT/$output" 2>&1
  echo "ncu ($output): exit $?"
}
[ -z "${NCU:-}" ] || profile ncu_kernels.txt "${NCU_SECONDS:-180}" "quantize|mma_"
# shellcheck disable=SC2086  # NCU_EXTRA is a list of arguments
[ -z "${NCU_EXTRA:-}" ] || profile ncu_extra.txt "${NCU_EXTRA_SECONDS:-150}" "quantize|mma_|merge|rotate" $NCU_EXTRA
