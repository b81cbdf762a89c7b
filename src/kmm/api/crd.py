"""The Module CustomResourceDefinition, rendered from :mod:`kmm.api.modules`.

The schema is structural (every node typed, no ``$ref``/``anyOf``, no
``additionalProperties`` beside ``properties``), built by walking the models'
type annotations rather than post-processing Pydantic's JSON Schema, which
uses ``$ref`` and ``anyOf`` throughout. Markers from :mod:`kmm.api.cel` add
CEL rules (``x-kubernetes-validations``), pass-through objects
(``x-kubernetes-preserve-unknown-fields``) and list types.

``deploy/crd/`` holds the committed rendering; a unit test keeps them equal.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal, Union

import annotated_types
import pydantic
from pydantic.fields import FieldInfo

from kmm.api import cel, modules

__all__ = ["NAME", "render", "schema_for"]

NAME = f"{modules.PLURAL}.{modules.GROUP}"

Schema = dict[str, Any]

_PRESERVE: Schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def _describe(model: type[pydantic.BaseModel]) -> str:
    """The first paragraph of a model's docstring, on one line."""
    paragraph = (model.__doc__ or "").strip().split("\n\n", 1)[0]
    # Docstrings use reST literals; kubectl explain shows plain text.
    return " ".join(line.strip() for line in paragraph.splitlines()).replace("``", "")


def _plain(value: object) -> object:
    """Tuples (hashable, for use in Annotated) rendered as YAML lists."""
    return [_plain(item) for item in value] if isinstance(value, tuple) else value


def _apply(schema: Schema, meta: object) -> Schema:
    """Merge one piece of ``Annotated`` metadata into ``schema``."""
    array = schema.get("type") == "array"
    if isinstance(meta, FieldInfo):
        for inner in meta.metadata:
            schema = _apply(schema, inner)
    elif isinstance(meta, annotated_types.MinLen):
        schema["minItems" if array else "minLength"] = meta.min_length
    elif isinstance(meta, annotated_types.MaxLen):
        schema["maxItems" if array else "maxLength"] = meta.max_length
    elif isinstance(meta, annotated_types.Ge):
        schema["minimum"] = meta.ge
    elif isinstance(meta, cel.Rule):
        schema.setdefault("x-kubernetes-validations", []).append(_rule(meta))
    elif isinstance(meta, cel.PassThrough):
        schema = dict(_PRESERVE)
    elif isinstance(meta, cel.SchemaExtra):
        schema.update({key: _plain(value) for key, value in meta.keywords})
    # Anything else (validators) has no schema form.
    return schema


def _rule(rule: cel.Rule) -> Schema:
    rendered: Schema = {"rule": rule.rule, "message": rule.message}
    if rule.field_path is not None:
        rendered["fieldPath"] = rule.field_path
    return rendered


def _is_any(tp: object) -> bool:
    return tp is Any or tp is object


def schema_for(tp: Any) -> Schema:
    """The structural schema of one Python type used in the models."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        inner, *metadata = typing.get_args(tp)
        schema = schema_for(inner)
        for meta in metadata:
            schema = _apply(schema, meta)
        return schema
    if origin is Union or origin is types.UnionType:
        options = [arg for arg in typing.get_args(tp) if arg is not type(None)]
        if len(options) != 1:
            raise TypeError(f"only Optional unions render structurally, not {tp}")
        return schema_for(options[0])
    if origin is Literal:
        values = list(typing.get_args(tp))
        return {"type": "string", "enum": values}
    if origin is list:
        (item,) = typing.get_args(tp)
        return {"type": "array", "items": schema_for(item)}
    if origin is dict:
        _key, value = typing.get_args(tp)
        if _is_any(value):
            return dict(_PRESERVE)
        return {"type": "object", "additionalProperties": schema_for(value)}
    if tp is str:
        return {"type": "string"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer", "format": "int64"}
    if isinstance(tp, type) and issubclass(tp, pydantic.BaseModel):
        return _model_schema(tp)
    raise TypeError(f"no structural schema for {tp!r}")


def _field_type(field: FieldInfo) -> Any:
    """The field's annotation with the metadata Pydantic lifted out put back."""
    if field.metadata:
        return typing.Annotated[(field.annotation, *field.metadata)]
    return field.annotation


def _model_schema(model: type[pydantic.BaseModel]) -> Schema:
    properties: Schema = {}
    required: list[str] = []
    for name, field in model.model_fields.items():
        wire = field.alias or name
        properties[wire] = schema_for(_field_type(field))
        if field.is_required():
            required.append(wire)
        elif isinstance(field.default, str):
            properties[wire]["default"] = field.default
    schema: Schema = {"type": "object", "description": _describe(model), "properties": properties}
    if required:
        schema["required"] = required
    if model.model_config.get("extra") == "allow":
        schema["x-kubernetes-preserve-unknown-fields"] = True
    rules = [_rule(rule) for rule in getattr(model, "cel_rules", ())]
    if rules:
        schema["x-kubernetes-validations"] = rules
    return schema


def _root_schema() -> Schema:
    spec = schema_for(modules.ModuleSpec)
    status = schema_for(modules.ModuleStatus)
    return {
        "type": "object",
        "description": _describe(modules.Module),
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "required": ["spec"],
    }


def _printer_columns() -> list[Schema]:
    return [
        {
            "name": "Ready",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
        },
        {
            "name": "Loaded",
            "type": "integer",
            "description": "Nodes where the module loader pod is available",
            "jsonPath": ".status.moduleLoader.availableNumber",
        },
        {
            "name": "Desired",
            "type": "integer",
            "description": "Nodes that should run the module loader",
            "jsonPath": ".status.moduleLoader.desiredNumber",
        },
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def render() -> Schema:
    """The CustomResourceDefinition object for Modules."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": NAME},
        "spec": {
            "group": modules.GROUP,
            "names": {
                "kind": modules.KIND,
                "listKind": f"{modules.KIND}List",
                "plural": modules.PLURAL,
                "singular": modules.KIND.lower(),
                "shortNames": ["mod"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": modules.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": _root_schema()},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": _printer_columns(),
                }
            ],
        },
    }
