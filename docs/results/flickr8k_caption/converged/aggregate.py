"""LOG.md §6c, the 2026-11-26 re-run (converged XE, the end token in the reward, no <unk>, the Java-exact
tokenizer): mean5/'s table of the captioners that were re-run, with a 95 % t-interval over seeds on
every seed-matched difference.   python aggregate.py [EVAL_FOLDER]  ({xe,scst,srfl_bl,...}_s{0,1,2}/report.json;
default: this folder, which holds the re-run's reports; its output is table.md)"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "mean5"))
from aggregate import COLS, KINDS, PAIRS  # noqa: E402  (mean5/aggregate.py)
from caption_table import table  # noqa: E402

if __name__ == "__main__":
    print(table(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent), KINDS, COLS, PAIRS, interval=True))
