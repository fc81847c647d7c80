"""Limits on client-supplied JSON Schemas, checked at submit before anything is stored.

A tool schema a client sends inline (``POST /v1/jobs``, ``/v1/chat/completions``) is compiled
into a grammar, walked by the cleaning and grounding steps and used for validation. Each of
these must terminate quickly, so :func:`check_client_schema` refuses, with the JSON pointer at
fault:

- a schema larger than ``max_bytes`` (compact JSON) or nested deeper than ``max_depth``;
- a ``pattern`` RE2 cannot run (:func:`tools.patterns.check_schema_patterns`);
- a ``$ref`` that is not local (``#`` or ``#/…``), does not resolve to a schema, or makes the
  schema recursive (inlining it would never end); ``$dynamicRef``, ``$recursiveRef`` and a nested
  ``$id`` (which would move what ``#`` means);
- more than ``max_refs`` references, or references that inline to more than ``max_expanded``
  schema nodes (a few definitions that each use the next twice double at every level).

Errors: :class:`~tools.errors.SchemaRejectedError` (``path``, ``reason``) and its subclass
:class:`~tools.errors.UnsupportedPatternError`.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from tools.errors import SchemaRejectedError
from tools.patterns import check_schema_patterns
from tools.schema_walk import subschemas

__all__ = [
    "DEFAULT_MAX_EXPANDED",
    "DEFAULT_MAX_REFS",
    "DEFAULT_MAX_SCHEMA_BYTES",
    "DEFAULT_MAX_SCHEMA_DEPTH",
    "check_client_schema",
]

DEFAULT_MAX_SCHEMA_BYTES = 64 * 1024
DEFAULT_MAX_SCHEMA_DEPTH = 24
DEFAULT_MAX_REFS = 256
DEFAULT_MAX_EXPANDED = 20_000


def _reject(path: str, reason: str, message: str, **details: Any) -> SchemaRejectedError:
    return SchemaRejectedError(path or "/", f"{message} (at {path or '/'})", reason=reason, **details)


def _depth_exceeds(schema: Any, limit: int, path: str) -> str | None:
    """The pointer of the first value nested deeper than ``limit``, or None."""
    stack: list[tuple[Any, int, str]] = [(schema, 1, path)]
    while stack:
        node, depth, where = stack.pop()
        if isinstance(node, Mapping):
            items = [(f"{where}/{str(k).replace('~', '~0').replace('/', '~1')}", v) for k, v in node.items()]
        elif isinstance(node, list):
            items = [(f"{where}/{i}", v) for i, v in enumerate(node)]
        else:
            continue
        if depth > limit:
            return where or "/"
        stack.extend((value, depth + 1, child) for child, value in items if isinstance(value, (Mapping, list)))
    return None


def _ref_pointer(ref: str) -> str | None:
    """``#/a/b`` as the JSON pointer ``/a/b`` (``#`` is ``""``); None for anything not local."""
    if ref == "#":
        return ""
    if not ref.startswith("#/"):
        return None
    return unquote(ref[1:])


def _within(pointer: str, root: str) -> bool:
    return pointer == root or pointer.startswith(root + "/")


def check_client_schema(schema: Any, *, path: str = "", max_bytes: int = DEFAULT_MAX_SCHEMA_BYTES,
                        max_depth: int = DEFAULT_MAX_SCHEMA_DEPTH, max_refs: int = DEFAULT_MAX_REFS,
                        max_expanded: int = DEFAULT_MAX_EXPANDED) -> None:
    """Refuse a client's schema the platform could not handle in bounded time and memory.

    ``path`` prefixes every pointer in errors (e.g. ``/tools/0/function/parameters``). Raises
    :class:`~tools.errors.SchemaRejectedError` (or :class:`~tools.errors.UnsupportedPatternError`).
    """
    if not isinstance(schema, (Mapping, bool)):
        raise _reject(path, "not_a_schema", "a JSON Schema must be an object or a boolean")
    size = len(json.dumps(schema, ensure_ascii=False, separators=(",", ":")).encode())
    if size > max_bytes:
        raise _reject(path, "too_large", f"the schema is {size} bytes; at most {max_bytes} are accepted",
                      size=size, limit=max_bytes)
    deep = _depth_exceeds(schema, max_depth, path)
    if deep is not None:
        raise _reject(deep, "too_deep", f"the schema is nested deeper than {max_depth} levels", limit=max_depth)
    check_schema_patterns(schema, path=path)
    if isinstance(schema, Mapping):
        _check_refs(schema, path, max_refs=max_refs, max_expanded=max_expanded)


def _check_refs(schema: Mapping[str, Any], path: str, *, max_refs: int, max_expanded: int) -> None:
    nodes = dict(subschemas(schema))  # pointer (relative to the schema) → schema object
    pointers = sorted(nodes)
    sites: list[tuple[str, str]] = []  # (pointer of the node holding the $ref, pointer of its target)
    for where in pointers:
        node = nodes[where]
        for keyword in ("$dynamicRef", "$recursiveRef"):
            if keyword in node:
                raise _reject(path + where + "/" + keyword, "dynamic_ref", f"{keyword} is not supported; use a local $ref")
        if "$id" in node and where:
            raise _reject(path + where + "/$id", "nested_id", "a nested $id is not supported (it changes what '#' means)")
        if "$ref" not in node:
            continue
        ref = node["$ref"]
        target = _ref_pointer(ref) if isinstance(ref, str) else None
        if target is None:
            raise _reject(path + where + "/$ref", "remote_ref", f"$ref {str(ref)[:200]!r} is not local; only '#' and "
                          "'#/…' references are accepted", ref=str(ref)[:200])
        if target not in nodes:
            raise _reject(path + where + "/$ref", "unresolved_ref", f"$ref {ref[:200]!r} does not point at a schema "
                          "inside this one", ref=ref[:200])
        sites.append((where, target))
    if len(sites) > max_refs:
        raise _reject(path, "too_many_refs", f"the schema has {len(sites)} $ref; at most {max_refs} are accepted",
                      limit=max_refs)
    if not sites:
        return
    site_pointers = sorted(where for where, _ in sites)
    targets_at = {where: target for where, target in sites}

    def inside(root: str) -> list[str]:
        """Ref sites in the subtree at ``root`` (pointers sort so that a subtree is one run)."""
        start = bisect.bisect_left(site_pointers, root)
        out = []
        for site in site_pointers[start:]:
            if not _within(site, root):
                if not site.startswith(root):
                    break
                continue  # a sibling such as /ab after /a: keep scanning the run
            out.append(site)
        return out

    def node_count(root: str) -> int:
        start = bisect.bisect_left(pointers, root)
        count = 0
        for pointer in pointers[start:]:
            if _within(pointer, root):
                count += 1
            elif not pointer.startswith(root):
                break
        return count

    # Inlining a $ref copies its target's subtree, with the references in it; it never ends when a
    # chain of references comes back to a target it is already inside. Depth-first over targets.
    expanded: dict[str, int] = {}
    active: dict[str, str] = {}  # target being expanded → the $ref site that led there

    def expand(target: str, via: str) -> int:
        if target in expanded:
            return expanded[target]
        if target in active:
            raise _reject(path + via + "/$ref", "recursive_ref", f"$ref {'#' + target!r} is recursive: inlining it "
                          "would never end", ref="#" + target)
        active[target] = via
        total = node_count(target)
        for site in inside(target):
            total += expand(targets_at[site], site)
            if total > max_expanded:
                raise _reject(path + site + "/$ref", "ref_expansion", f"references expand the schema to more than "
                              f"{max_expanded} schemas", limit=max_expanded)
        del active[target]
        expanded[target] = total
        return total

    for site, target in sites:
        expand(target, site)
    if expand("", "") > max_expanded:
        raise _reject(path, "ref_expansion", f"references expand the schema to more than {max_expanded} schemas",
                      limit=max_expanded)
