#!/bin/bash
# LOG.md §6c, "SCST that moves": per seed, XE, then from the same XE checkpoint SCST-CIDEr and SR-FL
# under each judge, with the val-chosen SCST setting (5 samples per image, mean-of-others baseline,
# temperature 0.5, batch 10, 40 distractors for the retrieval reward), then beam-5 test evaluation
# of every captioner under both judges.
#   J=runs/judges CAP=runs/cap SEEDS="0 1 2" bash run.sh train|eval
# J holds bl/best.pt and ltd/best.pt (ltd train --config flickr8k_baseline / flickr8k_ltd);
# Measured 2026-11-25: SEEDS 0 1 2 for every job (srfl_ltd_s2 and alpha 4 for seeds 1-2 in the evening,
# A4_SEEDS defaults to SEEDS; the first srfl_ltd_s2, killed for time before a checkpoint, was started over). scst_s0 is the val sweep's mean5_t0.5_lr5e-5_4ep run (identical steps).
# CAP holds xe_s{seed}/ (ltd caption train --config caption_flickr8k_xe --set train.seed=S); every finished
# XE and judge run gets a "done" file (touch), which the jobs wait for.
# EXTRA="train.num_threads=1" and two invocations run side by side on 2 cores (a failed job: rmdir its .claim).
set -e
: "${J:?set J}" "${CAP:?set CAP}" "${LTD_DATA_DIR:?set LTD_DATA_DIR}"
SEEDS=${SEEDS:-0 1 2}
. "$(dirname "$0")/../jobs.sh"
train() { local name="$1" cfg="$2"; shift 2; run_job "$CAP/$name" ltd caption train --config "$cfg" "$@"; }  # name config [args...]
case "$1" in
  train)  # two invocations share the list: each job is claimed once (mkdir is atomic)
    jobs=""; for kind in scst srfl_bl srfl_ltd; do for s in $SEEDS; do jobs="$jobs ${kind}_s$s"; done; done
    for s in ${A4_SEEDS:-$SEEDS}; do jobs="$jobs srfl_bl_a4_s$s"; done  # alpha 4 (the paper's ablation)
    for job in $jobs; do
      claim "$CAP/$job" || continue
      s=${job##*_s}; xe="--set train.init_from=$CAP/xe_s$s/best.pt --set train.seed=$s"
      wait_for "$CAP/xe_s$s/done"
      case "$job" in srfl_bl_*) wait_for "$J/bl/done" ;; srfl_ltd_*) wait_for "$J/ltd/done" ;; esac
      case "$job" in
        scst_*) train "$job" caption_flickr8k_scst_cider $xe ;;
        srfl_bl_a4_*) train "$job" caption_flickr8k_sr_fl $xe --retrieval "$J/bl/best.pt" --set scst.alpha=4 ;;
        srfl_bl_*) train "$job" caption_flickr8k_sr_fl $xe --retrieval "$J/bl/best.pt" ;;
        srfl_ltd_*) train "$job" caption_flickr8k_sr_fl $xe --retrieval "$J/ltd/best.pt" ;;
      esac
    done ;;
  eval)
    for s in $SEEDS; do
      for c in xe scst srfl_bl srfl_ltd srfl_bl_a4; do
        out="$CAP/eval/${c}_s$s"
        [ -f "$out/report.json" ] && continue
        [ -f "$CAP/${c}_s$s/done" ] || continue  # not trained (yet): run eval again later
        mkdir -p "$CAP/eval"
        ltd caption eval --checkpoint "$CAP/${c}_s$s/best.pt" --split test --no-progress \
          --retrieval "$J/bl/best.pt" --judge bl="$J/bl/best.pt" --judge ltd="$J/ltd/best.pt" \
          $( [ -f "$J/bl_s1/best.pt" ] && echo --judge bl_s1="$J/bl_s1/best.pt" ) --out "$out" > "$out.log" 2>&1
      done
    done ;;
  *) echo "usage: run.sh train|eval" >&2; exit 2 ;;
esac
