"""A multi-turn verifiers (v1) environment: the environment plays the user for two turns, the
verdict reads the second reply (`verifiers:vftest_multi`)."""

import verifiers.v1 as vf


class TwoTurnData(vf.TaskData):
    question: str
    answer: str


class TwoTurnTask(vf.Task[TwoTurnData]):
    @vf.reward(weight=0.5)
    async def confirmed(self, trace: vf.Trace) -> float:
        return 1.0 if trace.last_reply.startswith("Yes") else 0.0

    @vf.reward(weight=0.5)
    async def correct(self, trace: vf.Trace) -> float:
        return 1.0 if self.data.answer in trace.last_reply else 0.0


class TwoTurnConfig(vf.TasksetConfig):
    num_tasks: int = 2


class TwoTurnTaskset(vf.Taskset[TwoTurnTask, TwoTurnConfig]):
    def load(self):
        return [TwoTurnTask(TwoTurnData(name=f"What is {i}*3?", question=f"What is {i}*3?",
                                         answer=str(3 * i)), self.config.task)
                for i in range(self.config.num_tasks)]


class TwoTurnEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class TwoTurnEnv(vf.Env[TwoTurnEnvConfig]):
    async def run(self, task, agents):
        async with agents.player.interaction(task) as interaction:
            await interaction.turn(task.data.question)
            await interaction.turn("Are you sure?")


__all__ = ["TwoTurnEnv", "TwoTurnTask", "TwoTurnTaskset"]
