"""The documented config schema, read from the pydantic models (``ulorl-train --explain [KEY]``).

    for doc in field_docs():            # every leaf key: algo.mpt.tau, train.lr, ...
        print(doc.key, doc.type, doc.default, doc.range, doc.description)
    print(explain("algo.mpt"))          # a section, or one key; None = everything
    undocumented_fields()               # [] when every field has a description (a test asserts it)
"""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass
from typing import Any, Optional

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from ulorl.config import ExperimentConfig

_BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


@dataclass(frozen=True)
class FieldDoc:
    key: str            # dotted path, e.g. "algo.mpt.tau"
    type: str           # "float", "'off' | 'static' | 'dynamic'", "int | None"
    default: Any
    range: str          # "> 0, <= 1" or "" when unbounded
    description: str    # "" when undocumented


def _section_type(info: FieldInfo) -> Optional[type[BaseModel]]:
    ann = info.annotation
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def _type_name(ann: Any) -> str:
    origin = typing.get_origin(ann)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(ann))
    if origin is typing.Union or type(ann).__name__ == "UnionType":
        return " | ".join("None" if a is type(None) else _type_name(a) for a in typing.get_args(ann))
    if isinstance(ann, type) and origin is None:
        return ann.__name__
    return re.sub(r"\btyping\.", "", str(ann))


def _range(info: FieldInfo) -> str:
    parts = []
    for meta in info.metadata:
        for attr, sign in _BOUNDS:
            value = getattr(meta, attr, None)
            if value is not None:
                parts.append(f"{sign} {value}")
    return ", ".join(parts)


def _doc(key: str, info: FieldInfo) -> FieldDoc:
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    choices = extra.get("choices")
    type_name = " | ".join(repr(c) for c in choices) if isinstance(choices, list) else _type_name(info.annotation)
    default = info.get_default(call_default_factory=True)
    return FieldDoc(key, type_name, default, _range(info), info.description or "")


def _walk(model: type[BaseModel], prefix: str) -> list[tuple[str, FieldInfo, Optional[type[BaseModel]]]]:
    out = []
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        section = _section_type(info)
        out.append((key, info, section))
        if section is not None:
            out.extend(_walk(section, key + "."))
    return out


def field_docs(model: type[BaseModel] = ExperimentConfig) -> list[FieldDoc]:
    """Every leaf field (not sections) in schema order."""
    return [_doc(key, info) for key, info, section in _walk(model, "") if section is None]


def section_docs(model: type[BaseModel] = ExperimentConfig) -> dict[str, str]:
    """Section path -> its docstring's first paragraph ("" when it has none)."""
    out = {}
    for key, _info, section in _walk(model, ""):
        if section is not None:
            out[key] = " ".join((section.__doc__ or "").strip().split("\n\n")[0].split())
    return out


def undocumented_fields(model: type[BaseModel] = ExperimentConfig) -> list[str]:
    """Leaf keys without a description and sections without a docstring."""
    missing = [d.key for d in field_docs(model) if not d.description.strip()]
    missing += [key for key, text in section_docs(model).items() if not text]
    return missing


def _line(doc: FieldDoc) -> str:
    rng = f"  [{doc.range}]" if doc.range else ""
    return f"{doc.key}: {doc.type} = {doc.default!r}{rng}\n    {doc.description}"


def explain(key: Optional[str] = None) -> str:
    """Schema text of one key, of a section (all keys under it) or of everything (``key`` None).
    Raises KeyError naming the unknown key."""
    docs = field_docs()
    sections = section_docs()
    if key is None or key == "":
        chosen, head = docs, "every config key (ulorl-train --explain SECTION|KEY for one part)"
    elif key in sections:
        chosen, head = [d for d in docs if d.key.startswith(key + ".")], f"[{key}] {sections[key]}"
    else:
        chosen = [d for d in docs if d.key == key]
        head = ""
        if not chosen:
            raise KeyError(f"unknown config key {key!r}; sections: {', '.join(sorted(sections))}")
    lines = [head] if head else []
    lines += [_line(d) for d in chosen]
    return "\n".join(lines)
