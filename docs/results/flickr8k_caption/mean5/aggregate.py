"""LOG.md §6c "SCST that moves": mean ± std over seeds of every captioner's test report, and the
seed-matched differences SCST − XE and SR-FL − SCST.   python aggregate.py [EVAL_FOLDER]
(EVAL_FOLDER holds {xe,scst,srfl_bl,srfl_ltd}_s{0,1,2}/report.json; default: this folder)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from caption_table import table  # noqa: E402

KINDS = [("xe", "XE"), ("scst", "SCST, CIDEr-D only"), ("srfl_bl", "SR-FL, baseline judge"),
         ("srfl_bl_a4", "SR-FL, baseline judge, α 4"),
         ("srfl_ltd", "SR-FL, LTD judge")]
COLS = [("BLEU-4", None), ("METEOR", None), ("ROUGE-L", None), ("CIDEr-D", None), ("unique_%", None),
        ("novel_%", None), ("mean_length", None), ("self_R@1", "bl"), ("self_R@10", "bl"), ("self_R@1", "ltd"), ("self_R@10", "ltd")]
PAIRS = [("scst", "xe"), ("srfl_bl", "scst"), ("srfl_bl_a4", "scst"), ("srfl_ltd", "scst"), ("srfl_ltd", "srfl_bl")]
if __name__ == "__main__":
    print(table(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent), KINDS, COLS, PAIRS))
