"""scalerl: RL post-training of LLMs on verifiable rewards that scales predictably.

`scalerl.train(...)` and `scalerl.evaluate(...)` are the Python API (`scalerl.api`,
docs/python-api.md); they, and the exceptions bad input raises, are imported on first use, so
`import scalerl` stays light (scalerl/_lazy.py).
"""

from scalerl._lazy import lazy_exports

__version__ = "0.1.0"

__getattr__, __dir__ = lazy_exports(__name__, {
    "train": "scalerl.api",
    "evaluate": "scalerl.api",
    "TrainResult": "scalerl.api",
    "EvalResult": "scalerl.api",
    "RunFailedError": "scalerl.api",
    "ConfigError": "scalerl.config",
    "InputError": "scalerl.inputs",
    "DataError": "scalerl.data.rejects",
})
