"""A schema's field docstrings: the string literal right after each field in the class body.

Pydantic does not keep them, so they are read from the class source with ``ast``; the config
reference (:mod:`scaleforge.config.reference`) prints them beside each field.
"""

import ast
import functools
import inspect
import textwrap

from pydantic import BaseModel


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field docstrings of ``cls`` and its pydantic bases (a subclass that redeclares a field wins)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not issubclass(klass, BaseModel) or klass is BaseModel:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):  # no source (built at runtime): no docstrings to read
            continue
        body = tree.body[0].body
        for statement, after in zip(body, body[1:] + [None]):
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                docs.pop(statement.target.id, None)
                if (
                    isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)
                ):
                    docs[statement.target.id] = after.value.value
    return docs
