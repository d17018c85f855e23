"""`python -m app.cli …` runs `ltd …` (the same entry point as the console script)."""
import sys

from app.cli import main

sys.exit(main())
