#!/bin/bash
# RESULTS "The captioning demo" (issue 41): the scenes' captioning demo over 3 captioner seeds, the SCST
# setting chosen on val. The retrieval models are the demo's own (seed 0): the baseline and LTD judges,
# and the referee (synthetic_baseline, seed 1) that no captioner trains against.
#   D=runs/capdemo bash run.sh JOB        one job at a time (EXTRA="train.num_threads=1" by default)
# JOB: demo (the whole `ltd demo --no-serve --captioning`, timed: seed 0 of everything, setting A)
#      xe_sS (S = 1, 2: the captioner seeds beyond the demo's; seed 0 is the demo's captioners/xe)
#      KIND_SET_sS (KIND scst | srbl | srltd, SET a setting below): SCST from xe_sS
#      val_RUN / test_RUN: `ltd caption eval` of a run on val / test under the referee and both judges
# Settings (scst.*; each applied alike to the CIDEr-only control and to SR-FL):
#   A  the presets: 1 sample, greedy baseline, temperature 1, 50 images a step, 5 epochs, alpha 1
#   B  5 samples, mean-of-others baseline, temperature 0.5, 10 images a step + 40 distractors, 1 epoch, alpha 1
#   C  B with alpha 4
#   D  B with alpha 4 and 2 epochs
set -e
: "${D:?set D}"
LTD=${LTD:-ltd}
EXTRA=${EXTRA-train.num_threads=1}
. "$(dirname "$0")/../flickr8k_caption/jobs.sh"
R=$D/synthetic; C=$D/cap
JSON=$(${PY:-python} -c "from training.prepare import resolve_dataset_path as r; print(r('', synthetic_images=3000, synthetic_seed=0, show_progress=False))")
declare -A SET=(
  [A]=""
  [B]="scst.samples=5 scst.baseline=mean scst.temperature=0.5 scst.batch_size=10 scst.distractors=40 scst.epochs=1"
  [C]="scst.samples=5 scst.baseline=mean scst.temperature=0.5 scst.batch_size=10 scst.distractors=40 scst.epochs=1 scst.alpha=4"
  [D]="scst.samples=5 scst.baseline=mean scst.temperature=0.5 scst.batch_size=10 scst.distractors=40 scst.epochs=2 scst.alpha=4")
job="$1"; mkdir -p "$C"
ckpt_of() {  # a run's best.pt; seed 0 of setting A is the demo's own captioners
  if [ -f "$C/$1/best.pt" ]; then echo "$C/$1/best.pt"; return; fi
  case "$1" in xe_s0) d=xe ;; scst_A_s0) d=scst ;; srbl_A_s0) d=sr_bl ;; srltd_A_s0) d=sr_ltd ;; *) d=missing ;; esac
  echo "$R/captioners/$d/best.pt"
}
case "$job" in
  demo)
    /usr/bin/time -v $LTD demo --no-serve --captioning --out "$D" --no-progress > "$D/demo.log" 2> "$D/demo.time" ;;
  xe_s*)
    s=${job#xe_s}; run_job "$C/$job" $LTD caption train --config caption_synthetic_xe --set data.path=$JSON --set train.seed=$s ;;
  scst_*|srbl_*|srltd_*)
    kind=${job%%_*}; rest=${job#*_}; set=${rest%%_s*}; s=${rest##*_s}
    case $kind in
      scst)  cfg=caption_synthetic_scst_cider; judge="" ;;
      srbl)  cfg=caption_synthetic_sr_fl; judge="--retrieval $R/runs/bl/best.pt" ;;
      srltd) cfg=caption_synthetic_sr_fl; judge="--retrieval $R/runs/ltd/best.pt" ;;
    esac
    sets=${SET[$set]}; [ "$kind" = scst ] && sets=$(echo "$sets" | sed 's/scst.alpha=[0-9.]*//')
    run_job "$C/$job" $LTD caption train --config $cfg $judge --set data.path=$JSON --set train.seed=$s \
      --set train.init_from=$(ckpt_of xe_s$s) $(as_sets $sets) ;;
  val_*|test_*)
    split=${job%%_*}; run=${job#*_}; out="$C/$split/$run"; mkdir -p "$C/$split"
    [ -f "$out/report.json" ] && exit 0
    $LTD caption eval --checkpoint "$(ckpt_of $run)" --split $split --no-meteor --no-progress --judge referee=$R/runs/referee/best.pt \
      --judge bl=$R/runs/bl/best.pt --judge ltd=$R/runs/ltd/best.pt --out "$out" > "$out.log" 2>&1 ;;
  *) echo "usage: run.sh demo|xe_sS|KIND_SET_sS|val_RUN|test_RUN" >&2; exit 2 ;;
esac
