"""Verifiable rewards: math answers (math-verify), code in a sandbox, custom verifiers, routing.

Contract functions (0/1 scale, fraction of tests for code):

    from scalerl.rewards import math_reward, code_reward
    math_reward(completion, "\\frac{1}{2}")               # 1.0 if the last \\boxed{} after </think> equals it
    code_reward(completion, tests, timeout_s=10.0)       # fraction of tests passed

Training uses `RewardRouter(config)`, which picks each prompt's verifier from its `task`, maps
scores to the configured reward scale and counts every failure (see `router`). The sandbox's
active protections are detected once and logged (see `sandbox`). `RewardConfig` and its
`SandboxConfig` are the run config's `rewards` and `rewards.sandbox` sections (`scalerl.config`),
re-exported here.
"""

from scalerl.config import RewardConfig, SandboxConfig
from scalerl.rewards.answer import extract_boxed, extract_code, extract_final_answer, strip_thinking
from scalerl.rewards.code_verifier import CodeResult, CodeVerifier, code_reward, validate_tests
from scalerl.rewards.math_verifier import MathResult, MathVerifier, configure_math, math_reward
from scalerl.rewards.registry import VERIFIERS, VerifierResult, load_callable, register_verifier
from scalerl.rewards.router import RewardOutcome, RewardRouter
from scalerl.rewards.sandbox import (
    Protections,
    Sandbox,
    SandboxResult,
    SandboxUnavailableError,
    configure_sandbox,
    default_sandbox,
)

__all__ = [
    "VERIFIERS",
    "CodeResult",
    "CodeVerifier",
    "MathResult",
    "MathVerifier",
    "Protections",
    "RewardConfig",
    "RewardOutcome",
    "RewardRouter",
    "Sandbox",
    "SandboxConfig",
    "SandboxResult",
    "SandboxUnavailableError",
    "VerifierResult",
    "code_reward",
    "configure_math",
    "configure_sandbox",
    "default_sandbox",
    "extract_boxed",
    "extract_code",
    "extract_final_answer",
    "load_callable",
    "math_reward",
    "register_verifier",
    "strip_thinking",
    "validate_tests",
]
