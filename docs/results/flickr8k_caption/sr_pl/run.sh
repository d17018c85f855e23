#!/bin/bash
# RESULTS §6c, "Partially labelled data (SR-PL)": the captions of half the Flickr8k training images are
# hidden (data.labelled_fraction=0.5, the half drawn from train.seed). Per seed:
#   judge_s — the self-retrieval judge trained on the labelled half only (ltd train --config
#             flickr8k_baseline --set data.train_fraction=0.5: the same images for the same seed),
#   xeh_s   — XE on the labelled half (caption_flickr8k_sr_pl with scst.epochs=0),
#   then from that XE checkpoint, each 3 SCST epochs of the preset's setting:
#   cidh_s  — CIDEr-only on the labelled half (scst.alpha=0, scst.negatives=none: unlabelled images unused),
#   srflh_s — CIDEr + self-retrieval on the labelled half, unlabelled images unused (scst.negatives=none):
#             separates "the retrieval reward" from "the unlabelled images",
#   srpl_s  — SR-PL: + unlabelled images (retrieval reward only) as moderately hard negatives (ranks 10-100),
#   srpl_random_s / srpl_hardest_s — the negatives ablation (no mining / the hardest), ABL_SEEDS (default all 3).
# Then beam-5 test evaluation under the seed's half judge, the full-data judges of mean5/ (J/bl, J/ltd:
# trained on all training captions, so independent referees of the captioner's discriminativeness).
#   J=runs/judges CAP=runs/cap_pl SEEDS="0 1 2" EXTRA="train.num_threads=1" bash run.sh train|eval
# Two `train` invocations share the job list (mkdir claims; a failed job: rmdir its .claim and rerun).
set -e
: "${J:?set J}" "${CAP:?set CAP}" "${LTD_DATA_DIR:?set LTD_DATA_DIR}"
SEEDS=${SEEDS:-0 1 2}
ABL_SEEDS=${ABL_SEEDS:-$SEEDS}
extra=""; for s in ${EXTRA:-}; do extra="$extra --set $s"; done
mkdir -p "$CAP"
run() {  # name command [args...]: resumable, marks done
  local out="$CAP/$1"; shift
  [ -f "$out/done" ] && return 0
  local resume=""; [ -f "$out/checkpoint.pt" ] && resume="--resume"
  "$@" $extra $resume --out "$out" --no-progress > "$out.log" 2>&1
  touch "$out/done"
}
wait_for() { while [ ! -f "$1" ]; do sleep 20; done; }
case "$1" in
  train)
    jobs="judge_s0 xeh_s0 xeh_s1 xeh_s2 judge_s1 cidh_s0 cidh_s1 cidh_s2 srpl_s0 judge_s2 srpl_s1 srflh_s0 srpl_s2"
    for s in $ABL_SEEDS; do jobs="$jobs srpl_random_s$s srpl_hardest_s$s"; done
    jobs="$jobs srflh_s1 srflh_s2"
    for job in $jobs; do
      mkdir "$CAP/$job.claim" 2>/dev/null || continue
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
        *) wait_for "$CAP/judge_s$s/done"; jr="--retrieval $CAP/judge_s$s/best.pt"
           case "$job" in
             srflh_*) run "$job" ltd caption train --config caption_flickr8k_sr_pl $init $jr --set scst.negatives=none ;;
             srpl_random_*) run "$job" ltd caption train --config caption_flickr8k_sr_pl $init $jr --set scst.negatives=random ;;
             srpl_hardest_*) run "$job" ltd caption train --config caption_flickr8k_sr_pl $init $jr --set scst.negatives=hardest ;;
             srpl_*) run "$job" ltd caption train --config caption_flickr8k_sr_pl $init $jr ;;
           esac ;;
      esac
    done ;;
  eval)
    for s in $SEEDS; do
      for c in xeh cidh srflh srpl srpl_random srpl_hardest; do
        out="$CAP/eval/${c}_s$s"
        [ -f "$out/report.json" ] && continue
        [ -f "$CAP/${c}_s$s/done" ] && [ -f "$CAP/judge_s$s/done" ] || continue  # not trained (yet)
        mkdir -p "$CAP/eval"
        ltd caption eval --checkpoint "$CAP/${c}_s$s/best.pt" --split test --no-progress \
          --retrieval "$CAP/judge_s$s/best.pt" --judge half="$CAP/judge_s$s/best.pt" \
          --judge bl="$J/bl/best.pt" --judge ltd="$J/ltd/best.pt" --out "$out" > "$out.log" 2>&1
      done
    done ;;
  *) echo "usage: run.sh train|eval" >&2; exit 2 ;;
esac
