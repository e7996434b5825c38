"""A tool-using verifiers (v1) taskset: the task's tool server offers `add`; the reward reads the
answer after the tool result (`verifiers:vftest_tool`)."""

import verifiers.v1 as vf
from vftest_tool_server import AddToolset


class AddData(vf.TaskData):
    answer: str


class AddTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class AddTask(vf.Task[AddData, vf.State, AddTaskConfig]):
    @classmethod
    def toolsets(cls, config: AddTaskConfig) -> list[vf.Toolset]:
        return [AddToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        used = any(m.content and self.data.answer in str(m.content) for m in trace.tool_messages)
        return 1.0 if used and trace.last_reply.endswith(self.data.answer) else 0.0


class AddConfig(vf.TasksetConfig):
    task: AddTaskConfig = AddTaskConfig()


class AddTaskset(vf.Taskset[AddTask, AddConfig]):
    def load(self):
        return [AddTask(AddData(prompt="Use the add tool: what is 17+25?", answer="42"), self.config.task)]


__all__ = ["AddTask", "AddTaskset"]
