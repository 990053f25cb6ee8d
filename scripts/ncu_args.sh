# Sourced by scripts/h200_kernels.sh and scripts/ncu_decode_decoders.sh: the ncu report both take, as the array
# NCU_ARGS (sections, then the stall cycles per issued instruction by reason: what WarpStateStats sums in one number).
NCU_ARGS=(--clock-control none)
for section in SpeedOfLight Occupancy LaunchStats WarpStateStats SchedulerStats ComputeWorkloadAnalysis \
               MemoryWorkloadAnalysis InstructionStats; do
  NCU_ARGS+=(--section "$section")
done
stalls=""
for r in short_scoreboard long_scoreboard mio_throttle math_pipe_throttle wait not_selected selected dispatch_stall \
         lg_throttle barrier no_instruction branch_resolving; do
  stalls="$stalls,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
done
NCU_ARGS+=(--metrics "${stalls:1}")
