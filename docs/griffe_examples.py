"""A griffe extension for the API reference (mkdocs.yml): a Google-style ``Example:`` section
(singular, as Google's style guide also writes it) is read as ``Examples:``, so its doctest lines
render as code instead of as Markdown (where ``[('a', 1)]`` reads as a link)."""

import re
from typing import Any

import griffe

_SINGULAR = re.compile(r"^Example:[ \t]*$", re.M)


class SingularExampleSection(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _SINGULAR.sub("Examples:", obj.docstring.value)
