#!/bin/bash
# LOG.md §6c, "Making SCST move": SCST-CIDEr variants from one XE checkpoint, chosen on val CIDEr-D.
#   XE=runs/cap/xe_s0/best.pt OUT=runs/cap/scst_sweep bash run.sh [variant ...]
# EXTRA="train.num_threads=1" runs two lists side by side on 2 cores (as measured).
set -e
: "${XE:?set XE}" "${OUT:?set OUT}" "${LTD_DATA_DIR:?set LTD_DATA_DIR}"
sets() {
  case "$1" in
    paper_lr5e-5) echo "scst.epochs=6" ;;                                   # the preset: 1 sample, greedy baseline, 50 images
    paper_lr2e-4) echo "scst.epochs=6 scst.lr=2e-4" ;;
    mean5_lr5e-5) echo "scst.epochs=2 scst.batch_size=10 scst.samples=5 scst.baseline=mean" ;;
    mean5_lr2e-4) echo "scst.epochs=2 scst.batch_size=10 scst.samples=5 scst.baseline=mean scst.lr=2e-4" ;;
    mean5_t0.5_lr5e-5) echo "scst.epochs=2 scst.batch_size=10 scst.samples=5 scst.baseline=mean scst.temperature=0.5" ;;
    paper_t0.5_lr5e-5) echo "scst.epochs=6 scst.temperature=0.5" ;;
    # measured by resuming mean5_t0.5_lr5e-5 with scst.epochs=4: every step is seeded by (seed, epoch, step),
    # so epochs 1-2 are those of the 2-epoch run
    mean5_t0.5_lr5e-5_4ep) echo "scst.epochs=4 scst.batch_size=10 scst.samples=5 scst.baseline=mean scst.temperature=0.5" ;;
    *) echo "unknown variant $1" >&2; exit 2 ;;
  esac
}
. "$(dirname "$0")/../jobs.sh"
mkdir -p "$OUT"
for v in "${@:-paper_lr5e-5 paper_lr2e-4 mean5_lr5e-5 mean5_lr2e-4}"; do
  for v1 in $v; do
    sets "$v1" > /dev/null || exit 2  # an unknown variant stops the list
    run_job "$OUT/$v1" ltd caption train --config caption_flickr8k_scst_cider --set train.init_from="$XE" \
      $(as_sets $(sets "$v1"))
  done
done
