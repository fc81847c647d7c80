"""Tool specs: a name, a description, a strict JSON Schema for the arguments, and flags.

A spec is built from a pydantic parameter model (``ToolSpec.from_model``) or from an
inline OpenAI-format function definition (``ToolSpec.from_openai``). Field-level
extensions live in the schema itself so every stage reads the same document:

- ``x-aliases``: ``{alias: canonical}`` for semantic normalization (沪 → Shanghai); the
  aliases of an enum value also let the decider narrow that field to it (typed candidates);
- ``x-grounded``: ``true`` on a field (or a list of field names on an object): the value must be
  stated in the conversation or an earlier tool result, checked after decoding
  (:mod:`tools.grounding`); side-effecting tools ground numbers and pattern/format/enum strings
  by default, ``false`` opts a field out. A listed name that is no field is refused here.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tools.grounding import declaration_errors
from tools.schema_walk import PARTIAL, children, declared_types, subschemas

__all__ = ["ToolSpec", "strict_schema"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")


def strict_schema(schema: dict[str, Any], *, allow_extra: bool = False) -> dict[str, Any]:
    """Return a copy of ``schema`` in which every object schema refuses fields it does not declare.

    Objects are found by :func:`tools.schema_walk.subschemas`: a parameter *named*
    ``properties`` or ``type`` is a field, never an object schema. An object gets
    ``additionalProperties: false``; one whose fields are also declared beside it (``allOf``,
    ``if``/``then``/``else``, ``dependentSchemas``, a sibling ``$ref``) gets
    ``unevaluatedProperties: false`` instead, which sees those fields, and its parts are left
    open (closing each part would refuse the fields of the others). A schema-valued
    ``additionalProperties`` (a map: ``{"additionalProperties": {"type": "integer"}}``) is kept.
    """
    schema = copy.deepcopy(schema)
    parts: set[int] = set()  # subschemas that are part of their parent's own shape (allOf, if/then/else...)
    for _, node in subschemas(schema):
        parts.update(id(child) for keyword, _, child in children(node) if keyword in PARTIAL)
        if id(node) in parts or not ("object" in declared_types(node) or "properties" in node):
            continue
        node.setdefault("properties", {})
        spread = "$ref" in node or any(keyword in node for keyword in PARTIAL)
        closer = "unevaluatedProperties" if spread else "additionalProperties"
        if not allow_extra and not isinstance(node.get(closer), dict):
            node[closer] = False
    schema.pop("title", None)
    return schema


class ToolSpec(BaseModel):
    """Everything the platform knows about one tool."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(description="strict JSON Schema of the arguments object")
    side_effects: bool = False
    timeout_s: float = 10.0
    memory_mb: int = 256
    cpu_s: int | None = None
    networked: bool = False
    allow_extra: bool = False
    queue: str | None = None
    #: A person must approve each call before it runs (the job stops in ``awaiting_approval``).
    requires_approval: bool = False
    #: Its results are authoritative (the platform's own records, not text from outside): values only they state
    #: may ground a side-effecting call's fields. Unset, such a call waits for a person (``tools.grounding``).
    trusted_output: bool = False
    #: The same call may answer differently each time (a poll): an identical repeat in a run is not held back.
    repeatable: bool = False
    #: A failed call records the tool's own traceback under ``details.traceback`` (its frames only, paths relative
    #: to its package); the operator turns it on for every tool with ``TOOLRAIL_TOOL_ERROR_TRACEBACKS``.
    error_traceback: bool = False
    #: ``module:function`` executed in the sandbox; None for inline specs the client executes.
    entrypoint: str | None = None
    model: type[BaseModel] | None = Field(default=None, exclude=True)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"invalid tool name {value!r}: letters, digits, _ . - only, at most 64")
        return value

    @model_validator(mode="after")
    def _grounding_declared_on_real_fields(self) -> "ToolSpec":
        errors = declaration_errors(self.parameters)
        if errors:
            raise ValueError(f"tool {self.name!r}: " + "; ".join(f"/parameters{e}" for e in errors))
        return self

    @property
    def queue_name(self) -> str:
        """The Celery queue this tool's calls run on."""
        return self.queue or f"tool.{self.name}"

    @property
    def breaker_name(self) -> str:
        """Whose health a failed call speaks of: the circuit breaker's key (the tool; a source may share one among
        the tools of one server)."""
        return self.name

    @property
    def schema_hash(self) -> str:
        """A stable hash of the parameter schema (cache keys)."""
        return hashlib.sha256(json.dumps(self.parameters, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]

    def field_aliases(self) -> dict[str, dict[str, str]]:
        """``{field: {alias: canonical}}`` for top-level fields that declare aliases."""
        props = self.parameters.get("properties", {})
        return {name: dict(prop["x-aliases"]) for name, prop in props.items() if isinstance(prop, dict) and prop.get("x-aliases")}

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry for this spec."""
        return {"type": "function", "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    def public(self) -> dict[str, Any]:
        """What ``GET /v1/tools`` shows."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "side_effects": self.side_effects,
            "requires_approval": self.requires_approval,
            "timeout_s": self.timeout_s,
            "memory_mb": self.memory_mb,
            "queue": self.queue_name,
        }

    @classmethod
    def from_model(cls, name: str, model: type[BaseModel], *, description: str = "", entrypoint: str | None = None,
                   allow_extra: bool = False, **flags: Any) -> "ToolSpec":
        """Build a spec from a pydantic parameter model."""
        schema = strict_schema(model.model_json_schema(), allow_extra=allow_extra)
        return cls(name=name, description=description or (model.__doc__ or "").strip(), parameters=schema,
                   model=model, entrypoint=entrypoint, allow_extra=allow_extra, **flags)

    @classmethod
    def from_openai(cls, function: dict[str, Any]) -> "ToolSpec":
        """Build a spec from an OpenAI function definition (``{"type": "function", "function": {...}}`` or the inner dict)."""
        fn = function.get("function", function)
        if not isinstance(fn, dict) or "name" not in fn:
            raise ValueError("a function spec needs a 'name'")
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise ValueError(f"function {fn['name']!r}: /parameters must be a JSON Schema object")
        if params.get("type", "object") != "object":
            raise ValueError(f"function {fn['name']!r}: /parameters/type must be 'object', got {params['type']!r}")
        return cls(name=fn["name"], description=fn.get("description", "") or "", parameters=strict_schema(params))
