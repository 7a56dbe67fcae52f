"""Does an answer match what the service's OpenAPI document declares for it? A small JSON Schema checker
for the subset FastAPI writes ($ref, anyOf/oneOf/allOf, type, properties, required,
additionalProperties, items, enum, const), so the tests need no extra dependency."""

from __future__ import annotations

from typing import Any

__all__ = ["declared_schema", "violations"]

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def declared_schema(doc: dict[str, Any], path: str, method: str, status: int | str,
                    media: str = "application/json") -> dict[str, Any]:
    """The schema `doc` declares for that answer (AssertionError when it declares none)."""
    responses = doc["paths"][path][method.lower()]["responses"]
    assert str(status) in responses, f"{method} {path} does not declare {status}: {sorted(responses)}"
    content = responses[str(status)].get("content", {})
    assert media in content, f"{method} {path} {status} is declared as {sorted(content)}, not {media}"
    schema = content[media].get("schema")
    assert schema, f"{method} {path} {status} declares no schema"
    return schema


def violations(doc: dict[str, Any], schema: dict[str, Any], value: Any, where: str = "$") -> list[str]:
    """What in `value` does not match `schema` (empty: it matches)."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return violations(doc, doc["components"]["schemas"][name], value, where)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            tried = [violations(doc, s, value, where) for s in schema[key]]
            return [] if any(not t for t in tried) else [f"{where}: matches none of {key}: {tried}"]
    out: list[str] = []
    for sub in schema.get("allOf", []):
        out += violations(doc, sub, value, where)
    if "const" in schema and value != schema["const"]:
        out.append(f"{where}: {value!r} is not {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{where}: {value!r} is not one of {schema['enum']}")
    kind = schema.get("type")
    if kind is not None and not _is(kind, value):
        return out + [f"{where}: {type(value).__name__} is not {kind}"]
    if isinstance(value, dict):
        props = schema.get("properties", {})
        out += [f"{where}: missing {name!r}" for name in schema.get("required", []) if name not in value]
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if name in props:
                out += violations(doc, props[name], item, f"{where}.{name}")
            elif extra is False:
                out.append(f"{where}: {name!r} is not declared")
            elif isinstance(extra, dict):
                out += violations(doc, extra, item, f"{where}.{name}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            out += violations(doc, schema["items"], item, f"{where}[{i}]")
    return out


def _is(kind: str, value: Any) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES[kind]) and not (kind != "boolean" and isinstance(value, bool))
