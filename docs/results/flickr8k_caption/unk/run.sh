#!/bin/bash
# Issue 43: what <unk> suppression changes on a converged Flickr8k XE captioner (seed 0), test split, beam 5.
# CKPT=a caption best.pt U=output folder LTD_DATA_DIR=Flickr8k bash run.sh; then python compare.py $U/default $U/allow_unk
set -e
: "${CKPT:?set CKPT}" "${U:?set U}"
LTD=${LTD:-ltd}
$LTD caption eval --checkpoint "$CKPT" --split test --no-meteor --no-progress --out $U/default > $U/default.log 2>&1
$LTD caption eval --checkpoint "$CKPT" --split test --no-meteor --no-progress --allow-unk --out $U/allow_unk > $U/allow_unk.log 2>&1
