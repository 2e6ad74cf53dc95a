"""specq's own coding prompts, for the coder pair and any code model: writing a function from a
description (`code`), and editing a given file and returning it whole (`edit`), where most of the
answer repeats the prompt: the case prompt-lookup (n-gram) drafts are made for; `long-edit`, the
same with modules of Python's standard library (one to a few thousand tokens), where a draft that
reads only the prompt's last tokens (`MODEL:window=W`) should pay.

Written for specq (not taken from a benchmark), so no model was trained on these exact texts.
"""

from __future__ import annotations

CODE_TASKS = [
    "Write a Python function `is_palindrome(s)` that ignores case and non-alphanumeric characters.",
    "Write a Python function that merges two sorted lists into one sorted list without using "
    "sort().",
    "Write a Python function `chunks(items, n)` that yields successive lists of at most n items.",
    "Write a Python class `LRUCache` with get and put methods and a fixed capacity.",
    "Write a Python function that parses a line like 'key1=value1;key2=value2' into a dict.",
    "Write a Python function `flatten(nested)` that flattens arbitrarily nested lists.",
    "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "Write a Python function that counts the words in a text file and returns the ten most common.",
    "Write a JavaScript function `debounce(fn, ms)` and explain briefly how it works.",
    "Write a Python function that checks whether a string of brackets ()[]{} is balanced.",
    "Write a Python function `binary_search(items, target)` that returns the index or -1.",
    "Write a SQL query that returns the five customers with the highest total order amount, given "
    "tables customers(id, name) and orders(id, customer_id, amount).",
    "Write a Python dataclass `Point` with x and y, a distance method, and an example of its use.",
    "Write a Python function that converts a Roman numeral string to an integer.",
    "Write a bash script that prints the ten largest files under the current directory.",
    "Write a Python function `retry(times)` decorator that retries a function when it raises.",
]

_EDIT_FILES = [
    ('''def average(numbers):
    total = 0
    for n in numbers:
        total = total + n
    return total / len(numbers)


def largest(numbers):
    best = numbers[0]
    for n in numbers:
        if n > best:
            best = n
    return best
''', "Make both functions raise ValueError with a clear message when the list is empty."),
    ('''import json


def load_config(path):
    f = open(path)
    data = json.load(f)
    f.close()
    return data


def save_config(path, data):
    f = open(path, "w")
    json.dump(data, f)
    f.close()
''', "Use `with` statements for the files and write the JSON with an indent of 2."),
    ('''class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        return self.items.pop()

    def peek(self):
        return self.items[-1]

    def size(self):
        return len(self.items)
''', "Add type hints to every method and a docstring to the class."),
    ('''def fizzbuzz(n):
    out = []
    for i in range(1, n + 1):
        if i % 15 == 0:
            out.append("FizzBuzz")
        elif i % 3 == 0:
            out.append("Fizz")
        elif i % 5 == 0:
            out.append("Buzz")
        else:
            out.append(str(i))
    return out
''', "Rename the function to `fizz_buzz` and let it take the two divisors as optional arguments."),
    ('''def read_scores(lines):
    scores = {}
    for line in lines:
        name, score = line.split(",")
        scores[name] = int(score)
    return scores


def best_player(scores):
    return max(scores, key=scores.get)
''', "Skip blank lines and strip whitespace around names and scores."),
    ('''function sum(values) {
  var total = 0;
  for (var i = 0; i < values.length; i++) {
    total += values[i];
  }
  return total;
}

function mean(values) {
  return sum(values) / values.length;
}
''', "Use const and let instead of var, and export both functions."),
    ('''def celsius_to_fahrenheit(c):
    return c * 9 / 5 + 32


def fahrenheit_to_celsius(f):
    return (f - 32) * 5 / 9


def kelvin_to_celsius(k):
    return k - 273.15
''', "Add a function `celsius_to_kelvin` and a docstring to each function."),
    ('''import os


def list_python_files(folder):
    result = []
    for name in os.listdir(folder):
        if name.endswith(".py"):
            result.append(os.path.join(folder, name))
    return result
''', "Use pathlib instead of os, and sort the result."),
]


def edit_task(source: str, instruction: str) -> str:
    return f"{instruction} Return the whole file, changed, in one code block.\n\n```\n{source}```"


EDIT_TASKS = [edit_task(source, instruction) for source, instruction in _EDIT_FILES]

# Long files: modules of the running Python's standard library (the same text wherever that Python
# version runs), each with an edit of one name, so most of the answer repeats a long prompt.
_LONG_EDITS = [
    ("colorsys", "Rename the function `rgb_to_hsv` to `rgb_to_hue_saturation_value` everywhere."),
    ("fnmatch", "Rename the function `translate` to `pattern_to_regex` everywhere."),
    ("shlex", "Rename the function `split` to `split_command_line` everywhere."),
]


def long_edit_tasks() -> list[str]:
    import importlib
    import inspect

    return [edit_task(inspect.getsource(importlib.import_module(module)), instruction)
            for module, instruction in _LONG_EDITS]
