"""Attach to Ray (or start it) and wait on remote calls with a bound that names the peer.

A remote call that never answers (a hung collective, a wedged actor) would otherwise block the
controller forever; a dead actor raises deep inside Ray. `wait_all` turns both into a `PeerError`
whose message says which peer, doing what, and after how long, and which kind (`died` or
`timeout`), so callers can tell an engine to replace from a bug.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from scalerl.config import DistributedConfig


class PeerError(RuntimeError):
    """A remote peer failed: `kind` is "died" (its process is gone), "timeout" or "error"."""

    def __init__(self, peer: str, kind: str, message: str) -> None:
        super().__init__(message)
        self.peer = peer
        self.kind = kind


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError(
            "distributed.backend=ray needs Ray: pip install -e '.[distributed]' (or `make test-distributed`)"
        ) from None
    return ray


def connect(cfg: DistributedConfig) -> tuple[Any, bool]:
    """`ray.init` per `cfg` unless already connected; (the `ray` module, whether this call started it)."""
    ray = import_ray()
    if ray.is_initialized():
        return ray, False
    # Workers inherit the driver's environment; without a bound every torch actor would start one
    # thread per core and the actors sharing a node would oversubscribe it.
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "TOKENIZERS_PARALLELISM": "false"}
    kwargs: dict[str, Any] = {"include_dashboard": cfg.dashboard, "log_to_driver": True,
                              "runtime_env": {"env_vars": env}}
    # A cluster that is already running (RAY_ADDRESS, `ray job submit`, or `ray start --head` on
    # this machine) is joined as it is: Ray refuses resource arguments when it attaches, and the
    # cluster's resources are its own.
    with keep_signal_handlers():
        if cfg.address is not None:
            ray.init(address=cfg.address, **kwargs)
        elif running_cluster() is not None:
            # Ray's own lookup joins it, and with it the cluster's token authentication (Ray 2.60's
            # `ray start --head` turns it on; a driver given the address by name must also set
            # RAY_AUTH_MODE=token, as `ray job submit` drivers are).
            ray.init(**kwargs)
        else:
            ray.init(num_cpus=local_num_cpus(cfg), **kwargs)
    return ray, True


def running_cluster() -> str | None:
    """The cluster a bare `ray.init()` would attach to: `RAY_ADDRESS`, else the head that
    `ray start --head` started on this machine (Ray's own lookup); None: none, start one."""
    env = os.environ.get("RAY_ADDRESS")
    if env:
        return env
    try:  # Ray's lookup of the last `ray start` head (a private helper; ray>=2.60,<3 is pinned)
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:
        return None
    try:
        return canonicalize_bootstrap_address(None)
    except (ConnectionError, ValueError):
        return None


@contextlib.contextmanager
def keep_signal_handlers(
    signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT),
) -> Iterator[None]:
    """Put this process's Python handlers of `signals` back after the block.

    `ray.init` in a driver installs Ray's own fatal-signal handler at the C level, which replaces
    Python's: a SIGTERM then aborts the controller (exit -6, a stack dump) instead of reaching the
    handler `scalerl train` installed to stop at the next step with a checkpoint (exit 143;
    `scalerl.pipeline.preemption`). Re-registering a Python handler restores Python's C handler.
    Only the main thread can; elsewhere, and for signals without a Python handler, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.getsignal(sig) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in before.items():
            if callable(handler):
                signal.signal(sig, handler)


def requested_cpus(cfg: DistributedConfig) -> float:
    """Logical CPUs the run's actors ask for (engines and trainer ranks)."""
    return cfg.num_engines * cfg.engine_num_cpus + cfg.trainer_world_size * cfg.trainer_num_cpus


def local_num_cpus(cfg: DistributedConfig) -> float:
    """A local instance's logical CPUs: `num_cpus`, else enough for every actor of the run (at least
    this machine's cores). Ray CPUs are a scheduling budget, not a pinning: several actors on two
    cores time-share them, which is what a one-machine run wants."""
    if cfg.num_cpus is not None:
        return cfg.num_cpus
    return max(float(os.cpu_count() or 1), requested_cpus(cfg))


def classify(err: BaseException) -> str:
    """"died" for a lost actor process, else "error"."""
    ray = import_ray()
    died = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)
    return "died" if isinstance(err, died) else "error"


DEATH_GRACE_S = 5.0


def wait_all(refs: Mapping[str, Any], timeout_s: float, what: str) -> dict[str, Any]:
    """Results of every `{peer name: ObjectRef}`; raises `PeerError` for the first peer that died,
    failed, or had not answered within `timeout_s` (naming all such peers).

    When a peer fails, the others get `DEATH_GRACE_S` more: peers of a collective fail *because*
    one of them died (their connection to it closed), and the error must name the dead one."""
    ray = import_ray()
    names = {ref: name for name, ref in refs.items()}
    pending = list(names)
    deadline = time.monotonic() + timeout_s
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            late = ", ".join(names[r] for r in pending)
            raise PeerError(names[pending[0]], "timeout",
                            f"{what}: no answer from {late} within {timeout_s:g} s (distributed.timeout_s)")
        ready, pending = ray.wait(pending, num_returns=1, timeout=left)
        if not ready and pending and deadline - time.monotonic() <= 0:
            continue
        for ref in ready:
            try:
                ray.get(ref)
            except Exception as err:
                kind = classify(err)
                if kind != "died" and pending:
                    dead = _first_death(pending, names)
                    if dead is not None:
                        name, cause = dead
                        raise PeerError(name, "died", f"{what}: {name} died: {_short(cause)} (and so "
                                                      f"{names[ref]} failed: {_short(err, 300)})") from cause
                raise PeerError(names[ref], kind, f"{what}: {names[ref]} {kind}: {_short(err)}") from err
    return {name: ray.get(ref) for name, ref in refs.items()}


def _first_death(pending: list[Any], names: Mapping[Any, str]) -> tuple[str, BaseException] | None:
    ray = import_ray()
    ready, _ = ray.wait(pending, num_returns=len(pending), timeout=DEATH_GRACE_S)
    for ref in ready:
        try:
            ray.get(ref)
        except Exception as err:
            if classify(err) == "died":
                return names[ref], err
    return None


def _short(err: BaseException, limit: int = 2000) -> str:
    text = str(err).strip()
    return text if len(text) <= limit else text[:limit] + " ..."


def free_port() -> int:
    """A free TCP port on this host (for a process-group rendezvous)."""
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def node_ip() -> str:
    """This process's node address as Ray sees it (where a rendezvous store can listen)."""
    ray = import_ray()
    return str(ray.util.get_node_ip_address())


def wait_each(refs: Mapping[str, Any], timeout_s: float) -> dict[str, tuple[str, Any]]:
    """Every peer's outcome within `timeout_s`: name -> ("ok", value) | (kind, exception), kind
    "died", "error" or "timeout" (the exception is then a `PeerError`)."""
    ray = import_ray()
    names = {ref: name for name, ref in refs.items()}
    ready, pending = ray.wait(list(names), num_returns=len(names), timeout=timeout_s)
    out: dict[str, tuple[str, Any]] = {}
    for ref in ready:
        try:
            out[names[ref]] = ("ok", ray.get(ref))
        except Exception as err:
            out[names[ref]] = (classify(err), err)
    for ref in pending:
        out[names[ref]] = ("timeout", PeerError(names[ref], "timeout", f"{names[ref]}: no answer within "
                                                                        f"{timeout_s:g} s"))
    return out


def startup_hint(what: str, num_cpus: float, num_gpus: float) -> str:
    """Why an actor may never start: what it asks for against what the cluster has free."""
    ray = import_ray()
    free = ray.available_resources()
    return (f"{what} each ask for {num_cpus:g} CPU(s) and {num_gpus:g} GPU(s); the cluster has "
            f"{free.get('CPU', 0):g} CPU(s) and {free.get('GPU', 0):g} GPU(s) free: lower "
            "distributed.*_num_cpus / *_num_gpus, or add nodes")
