"""The examples in the public API's docstrings run, and give what they show.

Each public module's ``>>>`` examples are run by ``doctest`` (against ``TopologyTestDriver``, no
broker); the test fails on any example whose output differs, and on fewer examples than the
documented API holds (an example lost from a docstring is a failure too).
"""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "processor",
    "processor.dsl.builder",
    "processor.dsl.kstream",
    "processor.dsl.ktable",
    "processor.dsl.grouped",
    "processor.dsl.windows",
    "processor.dsl.emit",
    "processor.functions",
    "processor.papi",
    "processor.testing",
    "processor.serde",
]

# the number of examples the docstrings hold today; raise it when adding some
MIN_EXAMPLES = 143


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples_pass(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS, report=True)
    assert result.failed == 0, f"{result.failed} docstring example(s) of {module} failed (see the output above)"


def test_docstring_examples_are_there():
    finder = doctest.DocTestFinder()
    examples = sum(len(t.examples) for m in MODULES for t in finder.find(importlib.import_module(m)))
    assert examples >= MIN_EXAMPLES, f"only {examples} docstring examples in the public API (>= {MIN_EXAMPLES})"
