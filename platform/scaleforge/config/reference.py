"""The config reference, ``docs/config.md``, generated from the job schemas.

    python -m scaleforge.config.reference > docs/config.md     # or: make docs

Every schema in :data:`scaleforge.config.JOB_SCHEMAS` is walked through its nested models, lists
and tagged unions; each field becomes one table row: dotted name, type, default and its docstring
(the string literal right after the field in the class body, which pydantic does not keep, so it
is read from the class source with ``ast``). A nested model met again with the same defaults
links to its first table instead of repeating it. The output depends only on the schemas, so a
test compares it with the committed file.
"""

import inspect
import json
import re
import sys
import types
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Optional, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from scaleforge.config import JOB_SCHEMAS
from scaleforge.config.field_docs import field_docs
from scaleforge.storage import write_atomic

_REQUIRED = object()
_HEADER = """# Config reference

<!-- Generated from the schemas by `python -m scaleforge.config.reference` (`make docs`); \
do not edit by hand. -->

Every job reads one YAML file into its schema: `python -m jobs.<name> --config FILE`. Unknown keys
are errors. Any field can be overridden with `--set dotted.name=value` (the value is read as YAML);
`<i>` in a name stands for a list index (`--set recipe.0.alpha=0.9`). A field that holds a model
links to that model's table; a model that appears again with the same defaults links to its first
table. Validation and the pre-flight checks run before Ray starts and fail with one line naming
the field (`tests/config/test_cli_errors.py`).
"""


def render(schemas: Optional[Mapping[str, type[BaseModel]]] = None) -> str:
    """The reference as Markdown.

    Args:
        schemas: Job module -> its config schema; default every job in ``JOB_SCHEMAS``, in its order.

    Returns:
        One section per job: a table of its fields, then one table per nested model.
    """
    schemas = JOB_SCHEMAS if schemas is None else schemas
    sections = [section for job, schema in schemas.items() for section in _kinds(job, schema)]
    writer = _Writer()
    jobs = " · ".join(f"[`{job}`](#{_slug(job)})" for job, _ in sections)
    writer.lines += [_HEADER, f"Jobs: {jobs}", ""]
    for job, schema in sections:
        writer.job(job, schema)
    return "\n".join(writer.lines).rstrip("\n") + "\n"


def _kinds(job: str, schema: type[BaseModel]) -> list[tuple[str, type[BaseModel]]]:
    """A schema whose ``kind`` picks a subclass (the main job's) as one section per kind; any other
    as itself."""
    kind = schema.model_fields.get("kind")
    if kind is None or not kind.is_required():
        return [(job, schema)]
    return [(f"{job} (kind: {sub.model_fields['kind'].default})", sub) for sub in schema.__subclasses__()]


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.first: dict[str, str] = {}  # (class, defaults) -> link to where its table is
        self.queue: list[tuple] = []  # nested models whose sections come next

    def job(self, job: str, schema: type[BaseModel]) -> None:
        self.lines += [f'<a id="{_slug(job)}"></a>', "", f"## `{job}` ({schema.__name__})", ""]
        self.lines += _paragraphs(schema.__dict__.get("__doc__"))
        self._table(schema, None, "", _slug(job), job)
        while self.queue:  # breadth first: a job's sections in field order, deeper ones after them
            self._child(*self.queue.pop(0))

    def _table(self, cls: type[BaseModel], instance: Any, path: str, anchor: str, job: str) -> None:
        rows, children = [], []
        docs = field_docs(cls)
        for name, info in cls.model_fields.items():
            dotted = f"{path}.{name}" if path else name
            value = _default(info, instance, name)
            doc = _cell(info.description or docs.get(name, ""))
            nested = _nested(info)
            if nested is None:
                rows.append((dotted, _type(info.annotation, info.metadata), _value(value), doc))
                continue
            classes, is_list, optional, tag_field = nested
            item, links = f"{dotted}.<i>" if is_list else dotted, []
            for variant in classes:
                tag = _tag(variant, tag_field)
                sub_anchor = _slug(f"{anchor}-{name}" + (f"-{tag}" if tag_field else ""))
                title = (
                    f"`{item}`"
                    + (f" with `{tag_field}: {tag}`" if tag_field else "")
                    + f" ({variant.__name__})"
                )
                own = value if type(value) is variant else None  # the default's values, for its own variant
                children.append((variant, own, item, sub_anchor, title, doc, job))
                links.append(f"[`{tag if tag_field else variant.__name__}`](#{sub_anchor})")
            kind = ("one of " if len(links) > 1 else "") + ", ".join(links)
            kind += f" (chosen by `{tag_field}`)" if tag_field else ""
            kind = _list_of(kind, info.metadata) if is_list else kind
            shown = (
                (f"`{_tag(type(value), tag_field)}`" if tag_field else "")
                if isinstance(value, BaseModel)
                else _value(value)
            )  # a section's defaults are in its own table
            rows.append((dotted, kind + (" or null" if optional else ""), shown, doc))
        self.lines += ["| field | type | default | description |", "|---|---|---|---|"]
        self.lines += [f"| `{name}` | {kind} | {value} | {doc} |" for name, kind, value, doc in rows]
        self.lines.append("")
        self.queue += children

    def _child(self, cls, instance, path: str, anchor: str, title: str, doc: str, job: str) -> None:
        self.lines += [f'<a id="{anchor}"></a>', "", f"### {title}", ""]
        if doc:
            self.lines += [doc, ""]
        values = {name: _default(info, instance, name) for name, info in cls.model_fields.items()}
        key = f"{cls.__module__}.{cls.__qualname__} " + json.dumps(values, sort_keys=True, default=_plain)
        if key in self.first:
            self.lines += [f"Same fields and defaults as {self.first[key]}.", ""]
            return
        self.first[key] = f"[{title} in `{job}`](#{anchor})"
        self.lines += _paragraphs(cls.__dict__.get("__doc__"))
        self._table(cls, instance, path, anchor, job)


def _default(info: FieldInfo, instance: Any, name: str) -> Any:
    """The field's default where it sits: the parent default's value, else the field's own."""
    if isinstance(instance, BaseModel):
        return getattr(instance, name)
    return _REQUIRED if info.is_required() else info.get_default(call_default_factory=True)


def _nested(info: FieldInfo) -> Optional[tuple[list[type[BaseModel]], bool, bool, Optional[str]]]:
    """(model classes, is a list, may be null, tag field) when the field holds models, else None."""
    tp, is_list, optional = info.annotation, False, False
    tag_field = info.discriminator if isinstance(info.discriminator, str) else None
    while True:
        origin, args = get_origin(tp), get_args(tp)
        if origin is Annotated:
            tags = [m.discriminator for m in args[1:] if isinstance(getattr(m, "discriminator", None), str)]
            tag_field, tp = tag_field or (tags[0] if tags else None), args[0]
        elif origin is list and args and not is_list:
            is_list, tp = True, args[0]
        elif origin in (Union, types.UnionType):
            members = [a for a in args if a is not type(None)]
            optional = optional or len(members) < len(args)
            if len(members) > 1:
                models = all(isinstance(m, type) and issubclass(m, BaseModel) for m in members)
                return (members, is_list, optional, tag_field) if models else None
            tp = members[0]
        else:
            models = isinstance(tp, type) and issubclass(tp, BaseModel)
            return ([tp], is_list, optional, tag_field) if models else None


def _tag(cls: type[BaseModel], tag_field: Optional[str]) -> str:
    values = get_args(cls.model_fields[tag_field].annotation) if tag_field else ()
    return str(values[0]) if values else cls.__name__


_BOUNDS = (("gt", "> {}"), ("ge", ">= {}"), ("lt", "< {}"), ("le", "<= {}"), ("pattern", "matching `{}`"))


def _type(tp: Any, metadata=()) -> str:
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        return _type(args[0], (*args[1:], *metadata))
    metadata = [m for m in metadata if not isinstance(m, FieldInfo)]
    if origin in (Union, types.UnionType):  # the limits belong to the members: `int > 0 or null`
        text = " or ".join(_type(a, metadata) for a in args if a is not type(None))
        return text + (" or null" if type(None) in args else "")
    if origin is Literal:
        return ("one of " if len(args) > 1 else "") + ", ".join(f"`{a}`" for a in args)
    if origin is list:
        return _list_of(_type(args[0]), metadata) if args else "`list`"
    if origin is dict:
        return f"`dict[{', '.join(getattr(a, '__name__', str(a)) for a in args)}]`" if args else "`dict`"
    bounds = [
        form.format(getattr(m, attr))
        for m in metadata
        for attr, form in _BOUNDS
        if getattr(m, attr, None) is not None
    ]
    return f"`{getattr(tp, '__name__', tp)}`" + (f" {', '.join(bounds)}" if bounds else "")


def _list_of(item: str, metadata) -> str:
    shortest = max((getattr(m, "min_length", None) or 0 for m in metadata), default=0)
    text = ("non-empty " if shortest else "") + f"list of {item}"
    return text + (f" (at least {shortest} items)" if shortest > 1 else "")


def _value(value: Any) -> str:
    if value is _REQUIRED:
        return "required"
    text = value if isinstance(value, str) and value else json.dumps(value, default=_plain)
    return f"`{text}`".replace("|", "\\|")


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return "<required>" if value is _REQUIRED else str(value)


def _paragraphs(doc: Optional[str]) -> list[str]:
    if not doc:
        return []
    return [line for part in inspect.cleandoc(doc).split("\n\n") for line in (_cell(part), "")]


def _cell(text: str) -> str:
    """One Markdown line: reST roles and double backticks become code spans; pipes are escaped."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", " ".join(text.split()))
    return text.replace("``", "`").replace("|", "\\|")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def main(argv: Optional[list[str]] = None) -> int:
    """Print the reference, or write it atomically to the one path given."""
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        write_atomic(argv[0], render())
    else:
        sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
