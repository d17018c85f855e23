#!/bin/bash
# LOG.md §6c, "Partially labelled data (SR-PL)": the captions of half the Flickr8k training images are
# hidden (data.labelled_fraction=0.5, the half drawn from train.seed). Per seed:
#   judge_s — the self-retrieval judge trained on the labelled half only (ltd train --config
#             flickr8k_baseline --set data.train_fraction=0.5: the same images for the same seed),
#   xeh_s   — XE on the labelled half (caption_flickr8k_sr_pl with scst.epochs=0),
#   then from that XE checkpoint, each 3 SCST epochs of the preset's setting:
#   cidh_s  — CIDEr-only on the labelled half (scst.alpha=0, scst.negatives=none: unlabelled images unused),
#   srflh_s — CIDEr + self-retrieval on the labelled half, unlabelled images unused (scst.negatives=none):
#             separates "the retrieval reward" from "the unlabelled images",
#   srpl_s  — SR-PL: + unlabelled images (retrieval reward only) as moderately hard negatives (ranks 10-100; the
#             preset now ships the val choice 100-1000, so this job sets 10-100 itself),
#   srpl_random_s / srpl_hardest_s — the negatives ablation (no mining / the hardest), ABL_SEEDS (default all 3),
#   srpl_1to10_s / srpl_100to1000_s — other rank ranges [h_min, h_max] for the choice on val, RANGE_SEEDS (default all 3).
# `val`: each SR-PL range's captioner on the val split under the seed's half judge (the teacher; no test
# data, no referee): what select_range.py chooses the range from. The rule, fixed before these runs:
# the highest mean val self-R@10 under the teacher over the seeds, among ranges whose mean val CIDEr-D is
# within 1.0 of the best range's (R@10, not R@1: 1,000 val images give one seed's R@1 a ~0.7 wobble).
# Then beam-5 test evaluation under the seed's half judge, the full-data judges of mean5/ (J/bl, J/ltd:
# trained on all training captions, so independent referees of the captioner's discriminativeness).
#   J=runs/judges CAP=runs/cap_pl SEEDS="0 1 2" EXTRA="train.num_threads=1" bash run.sh train|val|eval
# JOBS="judge_s0 xeh_s0 ..." runs only those jobs (in that order). The `eval` referee J/ltd is required,
# J/bl is used when present.
# Two `train` invocations share the job list (mkdir claims; a failed job: rmdir its .claim and rerun).
set -e
: "${J:?set J}" "${CAP:?set CAP}" "${LTD_DATA_DIR:?set LTD_DATA_DIR}"
SEEDS=${SEEDS:-0 1 2}
ABL_SEEDS=${ABL_SEEDS:-$SEEDS}
RANGE_SEEDS=${RANGE_SEEDS:-$SEEDS}
RANGES="srpl_1to10 srpl srpl_100to1000"  # ranks 1-10, 10-100 (the rows above), 100-1000 (the val choice)
. "$(dirname "$0")/../jobs.sh"
mkdir -p "$CAP"
run() { local name="$1"; shift; run_job "$CAP/$name" "$@"; }
evaluate() {  # SPLIT FOLDER "KINDS" [JUDGE ARGS...]: beam-5 eval of every trained captioner once, under its seed's half judge
  local split="$1" dir="$2" kinds="$3" s c out; shift 3
  for s in $SEEDS; do
    for c in $kinds; do
      out="$CAP/$dir/${c}_s$s"
      [ -f "$out/report.json" ] && continue
      [ -f "$CAP/${c}_s$s/done" ] && [ -f "$CAP/judge_s$s/done" ] || continue  # not trained (yet)
      mkdir -p "$CAP/$dir"
      ltd caption eval --checkpoint "$CAP/${c}_s$s/best.pt" --split "$split" --no-progress \
        --retrieval "$CAP/judge_s$s/best.pt" --judge half="$CAP/judge_s$s/best.pt" "$@" --out "$out" > "$out.log" 2>&1
    done
  done
}
case "$1" in
  train)
    jobs="judge_s0 xeh_s0 xeh_s1 xeh_s2 judge_s1 cidh_s0 cidh_s1 cidh_s2 srpl_s0 judge_s2 srpl_s1 srflh_s0 srpl_s2"
    for s in $ABL_SEEDS; do jobs="$jobs srpl_random_s$s srpl_hardest_s$s"; done
    jobs="$jobs srflh_s1 srflh_s2"
    for s in $RANGE_SEEDS; do jobs="$jobs srpl_1to10_s$s srpl_100to1000_s$s"; done
    jobs=${JOBS:-$jobs}
    for job in $jobs; do
      claim "$CAP/$job" || continue
      s=${job##*_s}
      if [ "${job%_s*}" = judge ]; then
        run "$job" ltd train --config flickr8k_baseline --set data.train_fraction=0.5 --set train.seed="$s"
        continue
      fi
      [ "${job%_s*}" = xeh ] && { run "$job" ltd caption train --config caption_flickr8k_sr_pl --set scst.epochs=0 \
        --set train.seed="$s"; continue; }
      wait_for "$CAP/xeh_s$s/done"
      init="--set train.init_from=$CAP/xeh_s$s/best.pt --set train.seed=$s"
      case "$job" in
        cidh_*) run "$job" ltd caption train --config caption_flickr8k_sr_pl $init --set scst.alpha=0 \
                  --set scst.negatives=none --set scst.distractors=0 ;;
        *) wait_for "$CAP/judge_s$s/done"
           case "$job" in  # each SR-PL job's settings beside the preset's
             srflh_*) sets="scst.negatives=none" ;;
             srpl_random_*) sets="scst.negatives=random" ;;
             srpl_hardest_*) sets="scst.negatives=hardest scst.h_min=10 scst.h_max=100" ;;  # as recorded (rank 1 of the top 100)
             srpl_1to10_*) sets="scst.h_min=1 scst.h_max=10" ;;
             srpl_100to1000_*) sets="scst.h_min=100 scst.h_max=1000" ;;
             srpl_*) sets="scst.h_min=10 scst.h_max=100" ;;  # the ranks every row up to the range choice used
           esac
           run "$job" ltd caption train --config caption_flickr8k_sr_pl $init --retrieval "$CAP/judge_s$s/best.pt" \
             $(as_sets $sets) ;;
      esac
    done ;;
  val) evaluate val val "$RANGES" ;;  # the teacher only: no test data, no referee
  eval)
    refs="--judge ltd=$J/ltd/best.pt"; [ -f "$J/bl/best.pt" ] && refs="--judge bl=$J/bl/best.pt $refs"
    evaluate test eval "xeh cidh srflh srpl srpl_random srpl_hardest srpl_1to10 srpl_100to1000" $refs ;;
  *) echo "usage: run.sh train|val|eval" >&2; exit 2 ;;
esac
