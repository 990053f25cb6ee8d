#!/usr/bin/env bash
# ncu of one B=8/32K 4-bit decode launch per register-operand decoder (prmt and lut), with the stall
# reasons per issued instruction (scripts/ncu_args.sh): `bash scripts/ncu_decode_decoders.sh > ncu_decoders.txt` on the
# device, from the repository root (benchmarks/NOTES.md, Sessions 30-31).
set -uo pipefail
source scripts/ncu_args.sh
ncu "${NCU_ARGS[@]}" -k regex:mma_split \
  python3 -m benchmarks.ncu_quantize_decode --ops decode --bits 4 --decoders prmt lut
