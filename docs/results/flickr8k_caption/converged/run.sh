#!/bin/bash
# LOG.md §6c re-run (2026-11-26, issues 39 item 7 and 43): the mean5/ table's captioners with XE trained
# to convergence on val (caption_flickr8k_xe: up to 60 epochs, patience 5), the SCST reward counting the
# end token (scst.cider_eos), decoders that never emit <unk>, and the Java-exact PTB tokenizer in eval.
#   J=runs/judges CAP=runs/cap2 bash run.sh JOB      one job at a time (each at one thread)
# JOB: xe_sS | scst_sS | srfl_bl_sS | srfl_bl_a4_sS | srfl_ltd_sS | eval_NAME (NAME a finished run, e.g. scst_s1)
# J holds bl/ and ltd/ (ltd train --config flickr8k_baseline / flickr8k_ltd, 20 epochs: the SR-FL teacher
# and the referee no captioner trains against). Every job resumes a killed run; python aggregate.py $CAP/eval.
set -e
: "${J:?set J}" "${CAP:?set CAP}" "${LTD_DATA_DIR:?set LTD_DATA_DIR}"
EXTRA=${EXTRA-train.num_threads=1}
. "$(dirname "$0")/../jobs.sh"
LTD=${LTD:-ltd}
job="$1"; s=${job##*_s}; mkdir -p "$CAP"
train() { run_job "$CAP/$job" $LTD caption train --config "$@" --set train.seed=$s; }
from_xe="--set train.init_from=$CAP/xe_s$s/best.pt"
case "$job" in
  xe_s*)         train caption_flickr8k_xe ;;
  scst_s*)       train caption_flickr8k_scst_cider $from_xe ;;
  srfl_bl_a4_s*) train caption_flickr8k_sr_fl $from_xe --retrieval "$J/bl/best.pt" --set scst.alpha=4 ;;
  srfl_bl_s*)    train caption_flickr8k_sr_fl $from_xe --retrieval "$J/bl/best.pt" ;;
  srfl_ltd_s*)   train caption_flickr8k_sr_fl $from_xe --retrieval "$J/ltd/best.pt" ;;
  eval_*)
    run="${job#eval_}"; out="$CAP/eval/$run"; mkdir -p "$CAP/eval"
    [ -f "$out/report.json" ] && exit 0
    $LTD caption eval --checkpoint "$CAP/$run/best.pt" --split test --no-progress --retrieval "$J/bl/best.pt" \
      --judge bl="$J/bl/best.pt" --judge ltd="$J/ltd/best.pt" --out "$out" > "$out.log" 2>&1 ;;
  *) echo "usage: run.sh xe_sS|scst_sS|srfl_bl_sS|srfl_bl_a4_sS|srfl_ltd_sS|eval_RUN" >&2; exit 2 ;;
esac
