"""LOG.md §6c "Partially labelled data (SR-PL)": mean ± std over seeds of every labelled-half
captioner's test report and the seed-matched differences.   python aggregate.py [EVAL_FOLDER]
(EVAL_FOLDER holds {xeh,cidh,srflh,srpl,srpl_random,srpl_hardest,srpl_1to10,srpl_100to1000}_s{0,1,2}/report.json;
default: this folder; missing kinds are left out).
Judges: half = the seed's judge trained on the labelled half (the teacher); bl, ltd = mean5/'s judges
trained on every training caption (referees the captioner never trained against)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from caption_table import table  # noqa: E402

R = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent)
KINDS = [("xeh", "XE, labelled half"), ("cidh", "SCST CIDEr-D only, labelled half"),
         ("srflh", "SR-FL on the labelled half (no unlabelled images)"),
         ("srpl", "SR-PL, moderate negatives (ranks 10–100)"), ("srpl_random", "SR-PL, random negatives"),
         ("srpl_hardest", "SR-PL, hardest negative"), ("srpl_1to10", "SR-PL, negatives from ranks 1–10"),
         ("srpl_100to1000", "SR-PL, negatives from ranks 100–1000")]
COLS = [("BLEU-4", None), ("METEOR", None), ("ROUGE-L", None), ("CIDEr-D", None), ("unique_%", None),
        ("novel_%", None), ("mean_length", None), ("self_R@1", "half"), ("self_R@10", "half"),
        ("self_R@1", "ltd"), ("self_R@10", "ltd")]
PAIRS = [("cidh", "xeh"), ("srflh", "cidh"), ("srpl", "cidh"), ("srpl", "srflh"), ("srpl_random", "srpl"),
         ("srpl_hardest", "srpl"), ("srpl_1to10", "srpl"), ("srpl_100to1000", "srpl")]
print(table(R, KINDS, COLS, PAIRS))
