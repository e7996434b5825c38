"""Predictive accuracy of the ScaleRL sigmoid fit across recipes (see `scalerl.studies.accuracy`).

    python benchmarks/predictive_accuracy.py --recipes scalerl,gspo --max-steps 100
    python benchmarks/predictive_accuracy.py --help
"""

from __future__ import annotations

import sys

from scalerl.studies.accuracy import main

if __name__ == "__main__":
    sys.exit(main())
