"""kmm's CustomResourceDefinitions, rendered from the models of
:mod:`kmm.api.modules` (Module) and :mod:`kmm.api.preflight` (PreflightValidation).

The schema is structural (every node typed, no ``$ref``/``anyOf``, no
``additionalProperties`` beside ``properties``), built by walking the models'
type annotations rather than post-processing Pydantic's JSON Schema, which
uses ``$ref`` and ``anyOf`` throughout. Markers from :mod:`kmm.api.cel` add
CEL rules (``x-kubernetes-validations``), pass-through objects
(``x-kubernetes-preserve-unknown-fields``) and list types.

A ``Resource`` holds what sets one CRD apart (names, scope, root model,
printer columns); ``definition`` renders any of them the same way.
``deploy/crd/`` holds the committed rendering; a unit test keeps them equal.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Union

import annotated_types
import pydantic
from pydantic.fields import FieldInfo

from kmm.api import cel, modules, preflight

__all__ = [
    "MODULE",
    "NAME",
    "PREFLIGHT",
    "PREFLIGHT_NAME",
    "RESOURCES",
    "Resource",
    "definition",
    "render",
    "render_all",
    "render_preflight",
    "schema_for",
]

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
        elif isinstance(field.default, (str, bool)):
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


@dataclasses.dataclass(frozen=True)
class Resource:
    """What sets one CRD apart: its names, scope, root model and columns."""

    group: str
    version: str
    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    scope: Literal["Namespaced", "Cluster"]
    model: type[pydantic.BaseModel]
    columns: tuple[Schema, ...]

    @property
    def name(self) -> str:
        """The CRD's own name: ``<plural>.<group>``."""
        return f"{self.plural}.{self.group}"


def _age() -> Schema:
    return {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


MODULE = Resource(
    group=modules.GROUP,
    version=modules.VERSION,
    kind=modules.KIND,
    plural=modules.PLURAL,
    singular=modules.KIND.lower(),
    short_names=("mod",),
    scope="Namespaced",
    model=modules.Module,
    columns=(
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
        _age(),
    ),
)

# Cluster-scoped: one question about every Module in the cluster. Only
# v1beta2 is served (see kmm.api.preflight for why not v1beta1).
PREFLIGHT = Resource(
    group=preflight.GROUP,
    version=preflight.VERSION,
    kind=preflight.KIND,
    plural=preflight.PLURAL,
    singular=preflight.SINGULAR,
    short_names=preflight.SHORT_NAMES,
    scope="Cluster",
    model=preflight.PreflightValidation,
    columns=(
        {
            "name": "Kernel",
            "type": "string",
            "description": "The kernel every Module is validated against",
            "jsonPath": ".spec.kernelVersion",
        },
        {
            "name": "Push",
            "type": "boolean",
            "description": "Whether images built for the validation are pushed",
            "jsonPath": ".spec.pushBuiltImage",
        },
        _age(),
    ),
)

RESOURCES: tuple[Resource, ...] = (MODULE, PREFLIGHT)

NAME = MODULE.name
PREFLIGHT_NAME = PREFLIGHT.name


def _root_schema(model: type[pydantic.BaseModel]) -> Schema:
    fields = model.model_fields
    spec = schema_for(_field_type(fields["spec"]))
    status = schema_for(_field_type(fields["status"]))
    return {
        "type": "object",
        "description": _describe(model),
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "required": ["spec"],
    }


def definition(resource: Resource) -> Schema:
    """The CustomResourceDefinition object of ``resource``: one version,
    served and stored, with the status subresource."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": resource.name},
        "spec": {
            "group": resource.group,
            "names": {
                "kind": resource.kind,
                "listKind": f"{resource.kind}List",
                "plural": resource.plural,
                "singular": resource.singular,
                "shortNames": list(resource.short_names),
            },
            "scope": resource.scope,
            "versions": [
                {
                    "name": resource.version,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": _root_schema(resource.model)},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [dict(c) for c in resource.columns],
                }
            ],
        },
    }


def render() -> Schema:
    """The CustomResourceDefinition object for Modules."""
    return definition(MODULE)


def render_preflight() -> Schema:
    """The CustomResourceDefinition object for PreflightValidations."""
    return definition(PREFLIGHT)


def render_all() -> list[Schema]:
    """Every CustomResourceDefinition kmm installs, in apply order."""
    return [definition(resource) for resource in RESOURCES]
