"""Issue 43: what the two fixes change on one captioner's test report (LOG.md §6d).
    python compare.py DEFAULT_EVAL ALLOW_UNK_EVAL [OLD_COMMIT]
DEFAULT_EVAL / ALLOW_UNK_EVAL: `ltd caption eval` folders of the same checkpoint without and with
--allow-unk (run.sh). Prints the share of captions with <unk> when it is allowed, and CIDEr-D / BLEU-4 of
(a) the allowed captions under the Python tokenizer before the fix (OLD_COMMIT's indexer/ptb_tokenize.py,
which split <unk> into < unk >), (b) the same captions under the Java-exact port, (c) the default
captions (no <unk>) under the port: (a) → (b) is the tokenizer fix, (b) → (c) the decoding fix."""
import json
import subprocess
import sys
import types
from pathlib import Path

from indexer.caption_metrics import coco_scores

REPO = Path(__file__).resolve().parents[4]


def load(folder: str) -> tuple[dict, dict]:
    rows = json.loads((Path(folder) / "captions.json").read_text())
    return ({r["image_id"]: r["references"] for r in rows}, {r["image_id"]: [r["caption"]] for r in rows})


def old_tokenizer(commit: str):
    src = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:indexer/ptb_tokenize.py"], check=True,
                         capture_output=True, text=True).stdout
    mod = types.ModuleType("old_ptb_tokenize")
    exec(compile(src, "old_ptb_tokenize.py", "exec"), mod.__dict__)
    return mod.tokenize_for_eval


def scores(gts: dict, res: dict, tokenize=None) -> dict:
    if tokenize is None:
        return coco_scores(gts, res, meteor=False)
    return coco_scores(tokenize(gts), tokenize(res), meteor=False, tokenized=True)


def main() -> None:
    default, allowed, commit = sys.argv[1], sys.argv[2], (sys.argv[3] if len(sys.argv) > 3 else "02d301e")
    gts, res_unk = load(allowed)
    _, res_default = load(default)
    n_unk = sum("<unk>" in c[0] for c in res_unk.values())
    print(f"captions with <unk> when it is allowed: {n_unk} of {len(res_unk)}")
    rows = [("allowed <unk>, tokenizer before the fix", scores(gts, res_unk, old_tokenizer(commit))),
            ("allowed <unk>, Java-exact tokenizer", scores(gts, res_unk)),
            ("<unk> suppressed (the default), Java-exact tokenizer", scores(gts, res_default))]
    print("\n| captions, tokenizer | CIDEr-D | BLEU-4 |\n|---|---:|---:|")
    for name, s in rows:
        print(f"| {name} | {100 * s['CIDEr-D']:.2f} | {100 * s['BLEU-4']:.2f} |")


if __name__ == "__main__":
    main()
