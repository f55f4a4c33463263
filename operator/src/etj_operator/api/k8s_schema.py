"""The real Kubernetes schemas of the pod fields a job passes through (affinity, volumes, env valueFrom).

Without them those fields were ``x-kubernetes-preserve-unknown-fields``: the apiserver accepted any shape
(e.g. an affinity term whose ``weight`` is an object) and the job then failed at pod creation. The schemas
come from a real kube-apiserver's OpenAPI v3 (``/openapi/v3/api/v1``), turned into structural CRD schemas by
``extract`` and vendored in ``k8s_schemas.json``, so that generating the CRD needs no cluster.
``tests/api/test_api_apiserver.py`` checks the vendored file against the local apiserver's OpenAPI.

Regenerate (after a Kubernetes upgrade of the local control plane)::

    kubectl get --raw /openapi/v3/api/v1 > /tmp/v1.json
    python -m etj_operator.api.k8s_schema /tmp/v1.json
"""

from __future__ import annotations

import copy
import json
import sys
from functools import cache
from pathlib import Path
from typing import Any

SCHEMA_FILE = Path(__file__).with_name("k8s_schemas.json")
PREFIX = "io.k8s.api.core.v1."
# The pass-through types, by their name in the OpenAPI.
TYPES = ("Affinity", "Volume", "EnvVarSource")

_REF = "#/components/schemas/"
_INT_OR_STRING = {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]}
# Types whose OpenAPI shape is not structural, by what they are.
_SPECIAL: dict[str, dict[str, Any]] = {
    "io.k8s.apimachinery.pkg.api.resource.Quantity": _INT_OR_STRING,
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": _INT_OR_STRING,
    # Server-side apply bookkeeping and free-form metadata inside a volume claim template: not validated.
    "io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1": {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    },
    "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    },
}
# Keywords kept; the rest (defaults, list/patch strategies, unions) would change what the apiserver stores
# or needs keys the CRD does not have.
_KEEP = {"type", "format", "enum", "required", "minimum", "maximum", "minLength", "maxLength", "pattern"}
_FORMATS = {"int32", "int64", "float", "double", "byte", "date-time"}
_MAX_DESCRIPTION = 160
# Bounds where Kubernetes' schema has none (the apiserver's own validation has tighter ones for many
# fields): like every value in this CRD they keep the CEL cost estimates and one object's size finite.
MAX_STRING, MAX_ITEMS, MAX_ENTRIES = 4096, 256, 256


def _description(text: str) -> str:
    """The first sentence, bounded: the full texts would make the CRD several times larger."""
    first = text.split("\n", 1)[0].split(". ", 1)[0].strip().rstrip(".")
    return (first[: _MAX_DESCRIPTION - 1] + "…") if len(first) > _MAX_DESCRIPTION else first + "."


def _convert(node: dict[str, Any], schemas: dict[str, Any], seen: tuple[str, ...]) -> dict[str, Any]:
    description = node.get("description")
    if "allOf" in node and len(node["allOf"]) == 1:
        node = {**node["allOf"][0], **{k: v for k, v in node.items() if k != "allOf"}}
    if "$ref" in node:
        name = node["$ref"].removeprefix(_REF)
        if name in seen:
            raise ValueError(f"recursive schema {' -> '.join((*seen, name))}")
        if name in _SPECIAL:
            out = copy.deepcopy(_SPECIAL[name])
        else:
            out = _convert(schemas[name], schemas, (*seen, name))
        if description:
            out["description"] = _description(description)
        return out
    out = {k: v for k, v in node.items() if k in _KEEP}
    if out.get("format") not in _FORMATS:
        out.pop("format", None)
    if description:
        out["description"] = _description(description)
    if "properties" in node:
        out["properties"] = {
            name: _field(_convert(sub, schemas, seen)) for name, sub in sorted(node["properties"].items())
        }
    if "items" in node:
        out["items"] = _convert(node["items"], schemas, seen)
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = _convert(node["additionalProperties"], schemas, seen)
    if "type" not in out and not out.get("x-kubernetes-int-or-string"):
        out.update(type="object", **{"x-kubernetes-preserve-unknown-fields": True})
    kind = out.get("type")
    if kind == "string" and "enum" not in out and out.get("format") != "date-time":
        out.setdefault("maxLength", MAX_STRING)
    elif kind == "array":
        out.setdefault("maxItems", MAX_ITEMS)
    elif kind == "object" and "additionalProperties" in out:
        out.setdefault("maxProperties", MAX_ENTRIES)
    return out


def _field(node: dict[str, Any]) -> dict[str, Any]:
    node.setdefault("description", "See the Kubernetes API reference.")
    return node


def extract(openapi: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The structural schemas of ``TYPES`` from a kube-apiserver's ``/openapi/v3/api/v1`` document."""
    schemas = openapi["components"]["schemas"]
    return {name: _convert(schemas[PREFIX + name], schemas, (PREFIX + name,)) for name in TYPES}


@cache
def _vendored() -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = json.loads(SCHEMA_FILE.read_text())
    return data


def k8s_schema(name: str) -> dict[str, Any]:
    """A copy of the vendored structural schema of ``name`` (one of ``TYPES``)."""
    return copy.deepcopy(_vendored()[name])


def main(argv: list[str]) -> int:
    openapi = json.loads(Path(argv[0]).read_text())
    SCHEMA_FILE.write_text(json.dumps(extract(openapi), indent=1, sort_keys=True) + "\n")
    print(f"wrote: {SCHEMA_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
