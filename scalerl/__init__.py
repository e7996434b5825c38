"""scalerl: RL post-training of LLMs on verifiable rewards that scales predictably."""

__version__ = "0.1.0"
