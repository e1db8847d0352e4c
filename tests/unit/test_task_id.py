"""A task's two spellings come from one rule (``processor/engine/task_id.py``)."""

import pytest

from processor.engine.task_id import TaskId


def test_text_directory_and_back():
    t = TaskId(3, 12)
    assert (str(t), t.dirname) == ("3_12", "task-3_12")
    assert TaskId.parse("3_12") == t == (3, 12)
    assert TaskId.of_dirname("task-3_12") == t
    assert hash(t) == hash((3, 12))   # a key of the runtime's (sub, partition) dicts


@pytest.mark.parametrize("text", ["3", "3_", "_1", "a_1", "3-1", "3_1_2", ""])
def test_not_a_task_id(text):
    with pytest.raises(ValueError, match="not a task id"):
        TaskId.parse(text)


@pytest.mark.parametrize("name", ["task-3", "tasks-3_1", "task-3_1.partial", "global", "moved-aside"])
def test_other_directories_are_no_task(name):
    assert TaskId.of_dirname(name) is None
