"""The coding prompt sets: deterministic, chat-formatted, and an edit prompt carries its file."""

from specq.bench.coding import CODE_TASKS, EDIT_TASKS
from specq.bench.prompts import SETS, load_set


def test_code_and_edit_sets_load_in_order():
    for name, tasks in (("code", CODE_TASKS), ("edit", EDIT_TASKS)):
        assert name in SETS
        prompts = load_set(name, 3)
        assert [p.text for p in prompts] == tasks[:3] and all(p.chat for p in prompts)
        assert len(load_set(name, 1000)) == len(tasks) and len(set(tasks)) == len(tasks)


def test_an_edit_prompt_holds_the_whole_file_to_return():
    for text in EDIT_TASKS:
        instruction, _, block = text.partition("```\n")
        assert "Return the whole file" in instruction
        assert block.endswith("```") and block.count("\n") >= 8


def test_a_long_edit_prompt_holds_a_whole_standard_library_module():
    import inspect
    import shlex

    prompts = load_set("long-edit", 3)
    assert "long-edit" in SETS and len(prompts) == 3 and all(p.chat for p in prompts)
    assert [p.text for p in prompts] == [p.text for p in load_set("long-edit", 3)]
    assert prompts[2].text.endswith(f"```\n{inspect.getsource(shlex)}```")
    for p in prompts:
        instruction, _, block = p.text.partition("```\n")
        assert (instruction.startswith("Rename the function")
                and "Return the whole file" in instruction)
        name = instruction.split("`")[1]
        assert f"def {name}(" in block and len(block) > 3000
