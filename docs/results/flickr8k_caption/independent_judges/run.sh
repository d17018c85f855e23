#!/bin/bash
# LOG.md §6c, "Independent judges": every SR-FL captioner (3 seeds x {bl, ltd} judge) evaluated under
# the two training judges and three retrieval models no captioner trained against.
#   CAP=runs/cap VSRN=experiments/flickr8k_vsrn_short/runs OUT=runs/capjudge sh run.sh
# CAP holds srfl_{bl,ltd} (seed 0) and s1/, s2/ with the same; VSRN is the §6b grid's runs folder.
set -e
: "${CAP:?set CAP}" "${VSRN:?set VSRN}" "${OUT:?set OUT}" "${LTD_DATA_DIR:?set LTD_DATA_DIR}"
export LTD_IMAGE_RUNTIME=torch   # §6b's cached grid features
mkdir -p "$OUT"
for s in "" s1 s2; do
  for j in bl ltd; do
    out="$OUT/${s:-s0}_srfl_$j"
    [ -f "$out/report.json" ] && continue
    ltd caption eval --checkpoint "$CAP/${s:+$s/}srfl_$j/best.pt" --split test --no-progress \
      --retrieval "$VSRN/baseline/seed0/best.pt" \
      --judge bl_s0="$VSRN/baseline/seed0/best.pt" --judge ltd_s0="$VSRN/ltd_constraint@eta=0.2/seed0/best.pt" \
      --judge bl_s1="$VSRN/baseline/seed1/best.pt" --judge ltd_s1="$VSRN/ltd_constraint@eta=0.2/seed1/best.pt" \
      --judge dual_s0="$VSRN/ltd_dual@beta=20/seed0/best.pt" --out "$out" > "$out.log" 2>&1
  done
done
