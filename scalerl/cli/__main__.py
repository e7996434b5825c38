"""`python -m scalerl.cli ...`: the `scalerl` command (what the console script runs)."""

import sys

from scalerl.cli import main

sys.exit(main())
