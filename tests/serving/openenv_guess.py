"""An openenv-core environment written against the library: guess a number from "higher"/"lower"
hints; reward 1 on the step that guesses it. Served in process on localhost (no container)."""

from __future__ import annotations

from typing import Any

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class GuessAction(Action):
    guess: int


class GuessObservation(Observation):
    message: str = ""


class GuessEnvironment(Environment[GuessAction, GuessObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True
    SECRET = 6

    def __init__(self) -> None:
        super().__init__()
        self._state = State(step_count=0)

    def reset(self, seed: Any = None, episode_id: Any = None, **kwargs: Any) -> GuessObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(message="Guess a number from 1 to 9.", done=False, reward=0.0)

    def step(self, action: GuessAction, timeout_s: Any = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        if action.guess == self.SECRET:
            return GuessObservation(message="correct", done=True, reward=1.0)
        hint = "higher" if action.guess < self.SECRET else "lower"
        return GuessObservation(message=hint, done=self._state.step_count >= 4, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


def make_app() -> Any:
    from openenv.core.env_server.http_server import create_fastapi_app

    return create_fastapi_app(GuessEnvironment, GuessAction, GuessObservation, max_concurrent_envs=8)
