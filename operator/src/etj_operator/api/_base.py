"""Shared building blocks for the API models: base config, CEL rule helper, quantity type.

Kept apart from ``models.py`` so the spec and status modules stay small and both can use them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    PlainSerializer,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

# Kubernetes resource.Quantity, without a sign: negative sizes make no sense for a worker.
QUANTITY_RE = r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?[0-9]+))?$"
_QUANTITY = re.compile(QUANTITY_RE)

# A DNS-1123 label/subdomain, used for claim names and resource names.
DNS_SUBDOMAIN_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
ENV_NAME_RE = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
ABSOLUTE_PATH_RE = r"^/"


def cel(
    rule: str,
    message: str | None = None,
    *,
    message_expression: str | None = None,
    field_path: str | None = None,
    reason: str | None = None,
) -> dict[str, str]:
    """One ``x-kubernetes-validations`` entry (a CEL rule the apiserver evaluates).

    ``message`` must read as a sentence naming the field, because it is what ``kubectl apply`` prints.
    """
    out: dict[str, str] = {"rule": rule}
    if message is not None:
        out["message"] = message
    if message_expression is not None:
        out["messageExpression"] = message_expression
    if field_path is not None:
        out["fieldPath"] = field_path
    if reason is not None:
        out["reason"] = reason
    return out


def rules(*entries: dict[str, str]) -> dict[str, Any]:
    """``json_schema_extra`` carrying CEL rules; the CRD generator copies it verbatim."""
    return {"x-kubernetes-validations": list(entries)}


class ApiModel(BaseModel):
    """Base for every API object: camelCase on the wire, snake_case in Python.

    ``extra="forbid"`` mirrors the apiserver's strict field validation, so a spec the operator parses
    fails on the same typos ``kubectl apply`` rejects.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        use_enum_values=False,
    )

    def to_dict(self) -> dict[str, Any]:
        """camelCase, JSON-compatible dict without unset optional fields (what goes into a patch)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def _check_quantity(value: int | str) -> int | str:
    if isinstance(value, bool):
        raise ValueError("must be a Kubernetes quantity such as 500m, 2 or 16Gi, not a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must not be negative")
        return value
    if not _QUANTITY.match(value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity such as 500m, 2 or 16Gi")
    return value


_QUANTITY_RULE = cel(
    # A CEL raw string (r'...') keeps the regex readable in `kubectl get crd -o yaml`.
    "type(self) == int ? int(self) >= 0 : string(self).matches(r'" + QUANTITY_RE + "')",
    "must be a Kubernetes quantity such as 500m, 2 or 16Gi",
)

# An int-or-string Kubernetes quantity. The JSON schema is written by hand because the apiserver only
# accepts the exact ``x-kubernetes-int-or-string`` shape for union types in a structural schema.
Quantity = Annotated[
    int | str,
    AfterValidator(_check_quantity),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "maxLength": 64,
            "x-kubernetes-validations": [_QUANTITY_RULE],
        }
    ),
]


def unchanged(name: str) -> str:
    """CEL: field ``name`` is neither added, removed nor changed by an update.

    Written with has() because the apiserver also checks rules against the schema's ``default: {}``, where
    nested defaults have not been filled in yet, and because empty lists are absent.
    """
    return f"has(self.{name}) == has(oldSelf.{name}) && (!has(self.{name}) || self.{name} == oldSelf.{name})"


def section(cls: type[BaseModel], description: str) -> Any:
    """A nested object that is optional and filled with its own defaults when omitted.

    The explicit ``default: {}`` in the schema makes the apiserver apply the nested defaults too, so
    ``kubectl get -o yaml`` shows the effective settings.
    """
    return Field(default_factory=cls, description=description, json_schema_extra={"default": {}})


@dataclass(frozen=True)
class Matches:
    """``Annotated`` marker: the string must match ``regex``; a failure says ``message``, not the regex.

    An OpenAPI ``pattern`` failure prints only the regex, so the check is emitted as a CEL rule with a
    message instead, and pydantic enforces it with the same message.
    """

    regex: str
    message: str

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        compiled = re.compile(self.regex)

        def check(value: str) -> str:
            if not compiled.search(value):
                raise ValueError(self.message)
            return value

        return core_schema.no_info_after_validator_function(check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out = handler(schema)
        # A CEL raw string (r'...') keeps the regex readable in `kubectl get crd -o yaml`.
        out.setdefault("x-kubernetes-validations", []).append(
            cel(f"self.matches(r'{self.regex}')", self.message)
        )
        return out


def _rfc3339(value: datetime) -> str:
    # metav1.Time is RFC 3339 in UTC with whole seconds; naive datetimes are taken as UTC.
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# A timestamp serialized the way Kubernetes writes metav1.Time.
Time = Annotated[datetime, PlainSerializer(_rfc3339, return_type=str, when_used="json")]


@dataclass(frozen=True)
class Check:
    """A rule across fields, written once: the CEL rule the apiserver runs and the check pydantic runs.

    List them in a model's ``checks``; ``ApiModel`` emits each as an ``x-kubernetes-validations`` entry on
    the model's schema and runs ``holds`` after validation, raising ``message`` -- so ``kubectl apply`` and
    the operator's parser reject the same objects with the same words.
    """

    rule: str  # CEL, evaluated with ``self`` = the model's object
    message: str
    holds: Callable[[Any], bool]  # the same condition on the pydantic object
    field_path: str | None = None

    def entry(self) -> dict[str, str]:
        return cel(self.rule, self.message, field_path=self.field_path)


class CheckedModel(ApiModel):
    """An ``ApiModel`` with cross-field ``checks`` (see ``Check``)."""

    checks: ClassVar[tuple[Check, ...]] = ()

    @model_validator(mode="after")
    def _run_checks(self) -> Self:
        for c in type(self).checks:
            if not c.holds(self):
                raise ValueError(c.message)
        return self

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out = handler(schema)
        target = handler.resolve_ref_schema(out)
        if cls.checks:
            # A new list: the existing one may be the model_config's own (pydantic copies extras shallowly),
            # and extending it in place would add the checks again at every schema generation.
            rules = target.get("x-kubernetes-validations", [])
            target["x-kubernetes-validations"] = [*rules, *(c.entry() for c in cls.checks)]
        return out
