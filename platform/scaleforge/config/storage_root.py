"""``storage``: one root (a folder, or a URI every node reaches) under which a job's outputs go.

A job config lists where each of its paths goes under the root. With ``storage`` set, a path the
config leaves out goes there, and a relative one (``artifacts/teacher``) is taken under the root;
an absolute path, a ``~`` path or a URI is kept as written. So the shipped configs say
``storage: ~/scaleforge`` with relative paths, and ``--set storage=s3://bucket/scaleforge`` moves all
of a job's outputs into the bucket. Nothing is expanded or opened here (a ``~`` means the home of
the node that uses the path).
"""

from typing import Any

from pydantic import model_validator

from scaleforge.storage import is_uri, join


def under(root: str, path: str) -> str:
    """``path`` under ``root``: a URI root keeps its query last; a local root stays unexpanded."""
    return join(root, path) if is_uri(root) else f"{root.rstrip('/')}/{path}"


def _relative(path: Any) -> bool:
    return isinstance(path, str) and not (is_uri(path) or path.startswith(("/", "~")))


def storage_layout(layout: dict[str, str]):
    """A ``mode="before"`` model validator: each dotted field of ``layout`` goes under ``storage``
    (``layout[field]`` when the input leaves it out). Assign it in the config class's body."""

    def fill(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("storage") is None:
            return data
        data = dict(data)
        for dotted, default in layout.items():
            *sections, field = dotted.split(".")
            target = data
            for section in sections:
                inner = target.get(section) or {}
                if not isinstance(inner, dict):  # a section given as a model: it has its own values
                    break
                target[section] = target = dict(inner)
            else:
                given = target.get(field)
                if given is None or _relative(given):
                    target[field] = under(data["storage"], default if given is None else given)
        return data

    return model_validator(mode="before")(classmethod(fill))
