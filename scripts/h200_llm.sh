#!/usr/bin/env bash
# The H200 runs of the LLM experiments (results/needle/README.md), one or more stages per device call:
#   bash scripts/h200_llm.sh setup                          # wheels; every ferried GGUF -> one sha256-checked file,
#                                                           # its bf16 conversion (all models at once)
#   bash scripts/h200_llm.sh needle SECONDS [MODEL [OVERRIDES...]]    # Fig. 4 grid (4K-32K x 11 depths), resumable
#   bash scripts/h200_llm.sh ablation SECONDS [MODEL [OVERRIDES...]]  # kv_ablation at 16K x 11 depths x 10 seeds
#   bash scripts/h200_llm.sh ruler SECONDS [MODEL [OVERRIDES...]]     # RULER's 13 tasks x 4K-32K, resumable
#   bash scripts/h200_llm.sh longbench SECONDS [MODEL [OVERRIDES...]] # LongBench-style, contexts to 8K, resumable
#   bash scripts/h200_llm.sh dryrun SECONDS                 # Llama-3.1-8B-shaped random model at 104K tokens
#   bash scripts/h200_llm.sh parallel SECONDS JOBFILE       # every line "STAGE MODEL [OVERRIDES...]" of JOBFILE
#                                                           # as its own process, all sharing the GPU
#   bash scripts/h200_llm.sh detach SECONDS JOBFILE         # `parallel` in a process session of its own: it outlives
#                                                           # this call (until the machine goes back), so one run
#                                                           # spans calls and its processes compile and load once
#   bash scripts/h200_llm.sh wait SECONDS                   # in a later call: until the detached run ends (SECONDS at
#                                                           # most), packing every PACK_EVERY seconds
# MODEL: qwen25_coder_15b (default) | qwen25_coder_05b | smollm2_135m, each ferried as /tmp/model/<prefix>.partNN.
# Wheels are installed from /tmp/whl (scripts/ferry.py: what is carried and in how many calls), RULER samples made
# off the device are read from /tmp/tqcache/ruler_samples (the generators' cache: a sample set whose key does not
# match is generated here).
# Why parallel: a decode step on this path is bound by the host (benchmarks/NOTES.md), so several processes
# keep one GPU busier than one; their `seconds` columns are then not per-cell costs (the dry run never shares).
# Results accumulate in /tmp/tq_results, seeded from the committed stores (so a stage resumes the committed runs;
# the stores lock their files, so processes may share one), and are packed into $OUT every PACK_EVERY seconds
# and after each stage, so a call cut off at its limit still returns what was computed.
set -uo pipefail
stage=${1:?stage}; budget=${2:-540}; model=${3:-qwen25_coder_15b}
extra=("${@:4}")
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TURBOQUANT_CACHE_DIR=/tmp/tqcache PYTHONPATH=/tmp/site
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TOKENIZERS_PARALLELISM=false
mkdir -p /tmp/tq_logs
gguf_of() { case $1 in
  qwen25_coder_15b) echo qwen2.5-coder-1.5b-instruct-q4_k_m.gguf ;;
  qwen25_coder_05b) echo qwen2.5-coder-0.5b-instruct-q4_k_m.gguf ;;
  smollm2_135m)     echo SmolLM2-135M-Instruct.Q4_1.gguf ;;
  *) echo "unknown model $1" >&2; exit 2 ;; esac; }
prefix_of() { case $1 in qwen25_coder_15b) echo q15 ;; qwen25_coder_05b) echo q05 ;; smollm2_135m) echo s135 ;; esac; }
case $stage in parallel|setup|detach|wait) ;; *) GGUF=$(gguf_of "$model") || exit 2 ;; esac
MODEL="model=$model model.packaged_gguf=null +model.pretrained=/tmp/model +model.gguf_file=${GGUF:-}"
RESULTS="paths.results_dir=/tmp/tq_results paths.figures_dir=/tmp/tq_results/figures hydra.run.dir=/tmp/tq_hydra/${stage}_${model}_$$"
log="/tmp/tq_logs/${stage}_${model}_$$.txt"
run() { timeout --signal=INT "$budget" "${PY:-python3}" run.py "$@" $RESULTS "${extra[@]}" > "$log" 2>&1; echo "$stage $model ${extra[*]}: exit $?" | tee -a /tmp/tq_logs/exits.txt; tail -3 "$log"; }
# pack: each store's results.csv copied under the store's lock (processes append to it), then everything packed
pack() { mkdir -p /tmp/tq_results; rm -rf /tmp/tq_pack; mkdir -p /tmp/tq_pack/tq_results
         for d in /tmp/tq_results/*/; do n=$(basename "$d"); cp -r "$d" /tmp/tq_pack/tq_results/
           [ -f "$d/results.csv" ] && flock "$d/.lock" cp "$d/results.csv" "/tmp/tq_pack/tq_results/$n/results.csv"; done
         tar -czf "$OUT/results.tgz.tmp" -C /tmp/tq_pack tq_results -C /tmp tq_logs $(cd /tmp && ls -d tqcache/ruler_samples 2>/dev/null) && mv "$OUT/results.tgz.tmp" "$OUT/results.tgz"
         nvidia-smi --query-gpu=name,driver_version,memory.used,utilization.gpu --format=csv > "$OUT/gpu.txt"; }
# the needle grid without the unwindowed presets and KIVI 2-bit; every randomized method over the config's seeds 0-2
NEEDLE_METHODS=("~experiment.methods.turboquant_3p5" "~experiment.methods.turboquant_2p5" "~experiment.methods.kivi_2bit")
convert() {  # $1 = model: the ferried parts -> one GGUF, sha256 against its config, bf16 conversion on the GPU
  local m=$1 p f; p=$(prefix_of "$m"); f=$(gguf_of "$m")
  if ls /tmp/model/$p.part* >/dev/null 2>&1; then cat /tmp/model/$p.part* > /tmp/model/$f && rm /tmp/model/$p.part*; fi
  [ -f /tmp/model/$f ] || return 0
  python3 -c "
import hashlib, torch, transformers; from omegaconf import OmegaConf
from experiments.models import load_model, model_spec_from_config
cfg = OmegaConf.load('configs/model/$m.yaml'); want = cfg.packaged_gguf.sha256
got = hashlib.sha256(open('/tmp/model/$f', 'rb').read()).hexdigest()
assert got == want, f'/tmp/model/$f: sha256 {got}, expected {want} (configs/model/$m.yaml)'
cfg.packaged_gguf = None; cfg.pretrained = '/tmp/model'; cfg.gguf_file = '$f'
m = load_model(model_spec_from_config(cfg), 'cuda'); print('$m', got[:12], transformers.__version__, torch.__version__, m.provenance)"
}
case $stage in
  setup)
    for d in needle kv_ablation ruler longbench; do  # a stashed table would seed an empty store: everything recomputed
      if [ -d results/$d/runs ] && [ ! -f results/$d/results.csv ]; then
        echo "results/$d/results.csv is missing (stashed by scripts/ferry.py shrink?): restore it before this call" >&2
        exit 2
      fi
    done
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/whl/*.whl || exit 1
    python3 -c "import importlib, transformers; from packaging.version import Version
missing = [m for m in ('hydra', 'omegaconf', 'gguf', 'nltk', 'wonderwords', 'tenacity', 'needlehaystack')
           if importlib.util.find_spec(m) is None]
assert not missing and Version(transformers.__version__) >= Version('5.24'), (missing, transformers.__version__)" \
      || { echo "the wheels in /tmp/whl lack what the runs import (python scripts/ferry.py wheels)" >&2; exit 1; }
    mkdir -p /tmp/tq_results && for d in needle kv_ablation ruler longbench; do [ -d results/$d ] && cp -rn results/$d /tmp/tq_results/; done
    pids=(); for m in qwen25_coder_15b qwen25_coder_05b smollm2_135m; do convert $m & pids+=($!); done
    status=0; for p in "${pids[@]}"; do wait "$p" || status=1; done; exit $status ;;
  needle)   # the paper's rows, the best-preset candidates, vLLM's 4-bit preset and the baselines
    [ "$model" = smollm2_135m ] && extra+=("experiment.sizes.gpu.contexts=[4000,6000,8000]")  # its 8K window
    run experiment=needle $MODEL scale=gpu "${NEEDLE_METHODS[@]}" ;;
  ablation)
    run experiment=kv_ablation $MODEL scale=gpu ;;
  longbench) # LongBench-style (embedded data) at contexts to 8K, 13 datasets x 40 samples
    run experiment=longbench $MODEL scale=gpu ;;
  ruler)    # needs nltk, wonderwords, tenacity and llama-index-core==0.14.25 (punkt_tab) among the wheels
    run experiment=ruler $MODEL scale=gpu ;;
  dryrun)   # one cell per method at 104K tokens: seconds and GPU memory of model=llama31_8b scale=paper
    tok=$(ls -d /tmp/tqcache/models/local--qwen2.5-coder-1.5b-*--bfloat16 | head -1)
    run experiment=needle model=llama31_8b_random model.tokenizer="$tok" scale=gpu 'experiment.sizes.gpu.contexts=[104000]' \
      'experiment.sizes.gpu.depths=[0.5]' experiment.sizes.gpu.batch_size=1 'experiment.method_seeds=[0]' \
      '~experiment.methods.turboquant_3p5' '~experiment.methods.turboquant_2p5' '~experiment.methods.kivi_2bit' \
      '~experiment.methods.turboquant_2p5_window' '~experiment.methods.turboquant_b1_k3p5v2p5' '~experiment.methods.polarquant' \
      '+experiment.methods.turboquant_3p5_window_workspace={label:"TurboQuant 3.5-bit + window, workspace read path",cache:turboquant,options:{bits:3.5,residual_length:128,fused_decode:false,seed:0}}' ;;
  parallel) # $3 = a job file; each job runs with this call's budget, the packer runs beside them
    jobs=${3:?job file}; ( while sleep "${PACK_EVERY:-60}"; do pack; done ) & packer=$!
    pids=(); while read -r -a job; do
      [ ${#job[@]} -eq 0 ] || [ "${job[0]:0:1}" = "#" ] && continue
      NOPACK=1 bash "$0" "${job[0]}" "$budget" "${job[@]:1}" & pids+=($!)
    done < "$jobs"
    for p in "${pids[@]}"; do wait "$p"; done; kill "$packer" 2>/dev/null ;;
  detach)   # the device keeps a process that started its own session (setsid) running after the call returns
    [ -f "${3:?job file}" ] || { echo "no job file $3" >&2; exit 2; }
    PACK_EVERY=1000000 setsid bash "$0" parallel "$budget" "$3" > /tmp/tq_logs/detached.txt 2>&1 < /dev/null &
    echo $! > /tmp/tq_detached.pid; echo "detached: parallel $budget $3 (pid $!)" ;;
  wait)     # $2 = seconds at most; a call cut off by its limit returns the last pack
    pid=$(cat /tmp/tq_detached.pid 2>/dev/null) || { echo "nothing detached on this machine" >&2; exit 2; }
    start=$SECONDS; last=$SECONDS
    while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - start)) -lt "$budget" ]; do
      sleep 5; [ $((SECONDS - last)) -lt "${PACK_EVERY:-30}" ] || { pack; last=$SECONDS; }
    done
    kill -0 "$pid" 2>/dev/null && echo "the detached run goes on after $budget s" || echo "the detached run ended"
    cat /tmp/tq_logs/exits.txt 2>/dev/null | tail -20 ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
[ -n "${NOPACK:-}" ] || pack
