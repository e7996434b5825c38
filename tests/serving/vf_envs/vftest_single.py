"""A single-turn verifiers (v1) taskset written against the library: `verifiers:vftest_single`."""

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return 1.0 if trace.last_reply.strip().endswith(self.data.answer) else 0.0


class SumConfig(vf.TasksetConfig):
    num_tasks: int = 4


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self):
        return [SumTask(SumData(prompt=f"What is {i}+{i}?", answer=str(2 * i)), self.config.task)
                for i in range(self.config.num_tasks)]


__all__ = ["SumTask", "SumTaskset"]
