#!/usr/bin/env bash
# ncu of one B=8/32K 4-bit decode launch per register-operand decoder (prmt, the default, and lut), with the stall
# reasons per issued instruction: `bash scripts/ncu_decode_decoders.sh > ncu_decoders.txt` on the device (benchmarks/NOTES.md, Session 30).
set -uo pipefail
stalls=""
for r in short_scoreboard long_scoreboard mio_throttle math_pipe_throttle wait not_selected selected dispatch_stall \
         lg_throttle barrier no_instruction branch_resolving; do
  stalls="$stalls,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
done
ncu --clock-control none -k regex:mma_split --section SpeedOfLight --section Occupancy --section LaunchStats \
  --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section InstructionStats --metrics "${stalls:1}" \
  python3 -m benchmarks.ncu_quantize_decode --ops decode --bits 4 --decoders auto lut
