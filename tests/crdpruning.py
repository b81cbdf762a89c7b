"""What the API server's structural pruning drops from an object, read from
its CRD schema: tests that a manifest keeps every field it sets (a field
the schema does not know is dropped silently, which a test must not miss)."""

from __future__ import annotations

from typing import Any

__all__ = ["pruned"]


def pruned(schema: dict[str, Any], obj: Any, path: str = "") -> list[str]:
    """Paths the API server's pruning would drop from ``obj``."""
    if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
        return []
    if isinstance(obj, dict):
        if "additionalProperties" in schema:
            return []
        props = schema.get("properties", {})
        dropped = []
        for key, value in obj.items():
            if key in props:
                dropped += pruned(props[key], value, f"{path}.{key}")
            elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                dropped.append(f"{path}.{key}")
        return dropped
    if isinstance(obj, list):
        return [
            p for i, item in enumerate(obj) for p in pruned(schema["items"], item, f"{path}[{i}]")
        ]
    return []
