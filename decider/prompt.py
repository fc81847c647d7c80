"""Render conversations for the model: its own chat template, tools, and re-asks.

The model's chat template renders the messages. When the template knows about tools
(``tools`` appears in it), the tool specs go through ``apply_chat_template(..., tools=...)``;
otherwise (SmolLM2's plain ChatML) a compact one-line-per-tool rendering goes into the system
message. Either way the system message says what to write: the grammar forces the format, the
instruction only keeps a small model from fighting it.

Nothing here mutates the caller's messages: every function returns new lists of new dicts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tools.spec import ToolSpec

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "FEEDBACK_NAME",
    "JSON_TOOLS_INSTRUCTION",
    "PromptRenderer",
    "RenderedPrompt",
    "TOOL_FORMATS",
    "compact_tool_line",
    "compact_type",
    "reask_messages",
    "template_messages",
]

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant that calls tools."
#: How tools are shown to a model whose chat template has no tool support: ``compact`` (one
#: ``name(arg: type)`` line each) or ``json`` (a JSON list in ``<tools>`` tags).
TOOL_FORMATS = ("compact", "json")
JSON_TOOLS_INSTRUCTION = (
    "You are an expert in composing functions. You are given a question and a set of possible functions. Based on "
    "the question, you will need to make one or more function/tool calls to achieve the purpose. If none of the "
    "functions can be used, point it out and refuse to answer. If the given question lacks the parameters required "
    "by the function, also point it out.")
#: The ``name`` of the user message that carries the platform's re-ask feedback.
FEEDBACK_NAME = "validator"
#: Errors shown in one re-ask message (the first ones; the job record keeps them all).
REASK_MAX_ERRORS = 8


@dataclass(frozen=True)
class RenderedPrompt:
    """A prompt ready for the backend."""

    text: str
    template_tools: bool


def compact_type(schema: Any, depth: int = 0) -> str:
    """A short type expression for a schema: ``"today"|"tomorrow"``, ``number``, ``{a: string}``."""
    if not isinstance(schema, Mapping):
        return "any"
    if "enum" in schema:
        return "|".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"][:12]) + ("|..." if len(schema["enum"]) > 12 else "")
    if "const" in schema:
        return json.dumps(schema["const"], ensure_ascii=False)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " | ".join(compact_type(s, depth + 1) for s in schema[key])
    kind = schema.get("type")
    if isinstance(kind, list):
        return "|".join(map(str, kind))
    if kind == "array":
        return compact_type(schema.get("items", {}), depth + 1) + "[]"
    if kind == "object" or "properties" in schema:
        if depth > 2:
            return "object"
        required = set(schema.get("required", []))
        fields = [f"{name}{'' if name in required else '?'}: {compact_type(sub, depth + 1)}"
                  for name, sub in (schema.get("properties") or {}).items()]
        return "{" + ", ".join(fields) + "}"
    return str(kind or "any")


def compact_tool_line(spec: ToolSpec, parameters: Mapping[str, Any] | None = None) -> str:
    """``name(arg: type, opt?: type) - description`` for one tool."""
    params = parameters if parameters is not None else spec.parameters
    required = set(params.get("required", []))
    args = ", ".join(f"{name}{'' if name in required else '?'}: {compact_type(sub)}"
                     for name, sub in (params.get("properties") or {}).items())
    line = f"- {spec.name}({args})"
    return f"{line} - {spec.description.strip()}" if spec.description.strip() else line


def template_messages(messages: Sequence[Mapping[str, Any]], *, template_tools: bool = False) -> list[dict[str, Any]]:
    """Copies of ``messages`` that any chat template renders.

    Content parts are joined into text; ``None`` content becomes ``""``; for templates without
    tool support, assistant ``tool_calls`` become their JSON text and ``tool`` messages become
    ``tool`` turns carrying the result text.
    """
    out: list[dict[str, Any]] = []
    for message in messages:
        role = str(message.get("role", "user"))
        content = message.get("content")
        if isinstance(content, list):
            content = "\n".join(p.get("text", "") for p in content if isinstance(p, Mapping))
        content = "" if content is None else str(content)
        copy: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": content}
        calls = message.get("tool_calls")
        if calls:
            if template_tools:
                copy["tool_calls"] = [dict(c) for c in calls]
            else:
                rendered = [{"name": (c.get("function") or {}).get("name"),
                             "arguments": _maybe_json((c.get("function") or {}).get("arguments"))} for c in calls]
                copy["content"] = (content + "\n" if content else "") + json.dumps(rendered, ensure_ascii=False)
        if role == "tool" and message.get("tool_call_id") and template_tools:
            copy["tool_call_id"] = message["tool_call_id"]
        out.append(copy)
    return out


def _maybe_json(text: Any) -> Any:
    if isinstance(text, str):
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


def _error_line(error: str | Mapping[str, Any]) -> str:
    if isinstance(error, str):
        return f"- {error}"
    where = f"call {error['call']} ({error.get('tool') or '?'}) " if "call" in error else ""
    return f"- {where}{error.get('path') or '/'}: {error.get('message')}"


def reask_messages(messages: Sequence[Mapping[str, Any]], *, output: str,
                   errors: Sequence[str | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A new message list for a re-ask: the previous output and exactly what was wrong with it.

    ``errors`` are ``{path, message[, call, tool]}`` records (or plain lines). The caller's list
    and dicts are left untouched. The one re-ask wording, for jobs and the OpenAI endpoint alike.
    """
    listed = "\n".join(_error_line(e) for e in list(errors)[:REASK_MAX_ERRORS]) or "- the output did not match the schema"
    feedback = (f"Your previous reply was invalid:\n{listed}\nReply again with corrected tool calls. Use only values "
                "the user or a tool gave; if a required value is missing, do not guess it: answer in text and ask for it.")
    return [dict(m) for m in messages] + [
        {"role": "assistant", "content": output},
        {"role": "user", "name": FEEDBACK_NAME, "content": feedback},
    ]


class PromptRenderer:
    """Renders decisions and structured-output requests with one tokenizer's chat template."""

    def __init__(self, tokenizer: Any, *, system_prompt: str = DEFAULT_SYSTEM_PROMPT, tool_format: str = "compact",
                 call_format: Any = None) -> None:
        if tool_format not in TOOL_FORMATS:
            raise ValueError(f"tool_format must be one of {TOOL_FORMATS}, got {tool_format!r}")
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.tool_format = tool_format
        template = getattr(tokenizer, "chat_template", None) or ""
        self.template_tools = isinstance(template, str) and "tools" in template
        #: A native :class:`decider.tool_formats.ToolFormat`: the template renders tools and calls its own way.
        self.call_format = call_format if getattr(call_format, "native", False) else None

    def _apply(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": True}
        if tools and self.template_tools:
            kwargs["tools"] = tools
        return self.tokenizer.apply_chat_template(messages, **kwargs)

    @staticmethod
    def _with_system(messages: list[dict[str, Any]], instruction: str) -> list[dict[str, Any]]:
        if messages and messages[0]["role"] == "system":
            first = {**messages[0], "content": f"{instruction}\n\n{messages[0]['content']}".strip()}
            return [first, *messages[1:]]
        return [{"role": "system", "content": instruction}, *messages]

    def render_tools(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[ToolSpec], *,
                     parameters: Mapping[str, Mapping[str, Any]] | None = None, allow_text: bool = False,
                     max_calls: int | None = None) -> RenderedPrompt:
        """The prompt for a tool-call decision over ``tools`` (``parameters``: narrowed schemas to show)."""
        parameters = parameters or {}
        if self.call_format is not None and tools:
            # The family's own template says how to call; the constraint forces its syntax. Nothing is added.
            msgs = self.call_format.template_messages(messages)
            return RenderedPrompt(text=self._apply(msgs, [t.to_openai() for t in tools]), template_tools=True)
        msgs = template_messages(messages, template_tools=self.template_tools)
        if self.tool_format == "json" and tools and not self.template_tools:
            return self._render_json_tools(msgs, tools, parameters, allow_text)
        lines = [self.system_prompt]
        if tools and not self.template_tools:
            lines.append("Tools:")
            lines.extend(compact_tool_line(t, parameters.get(t.name)) for t in tools)
        if tools:
            many = "one call per action the user asks for" if (max_calls or 2) > 1 else "exactly one call"
            lines.append(f'Reply with a JSON array of tool calls ({many}): [{{"name": "<tool>", "arguments": {{...}}}}]')
        if allow_text or not tools:
            lines.append('If no tool applies, reply {"content": "<your answer>"}.' if tools else "Answer the user directly.")
        text = self._apply(self._with_system(msgs, "\n".join(lines)),
                           [t.to_openai() for t in tools] if tools else None)
        return RenderedPrompt(text=text, template_tools=self.template_tools)

    def _render_json_tools(self, msgs: list[dict[str, Any]], tools: Sequence[ToolSpec],
                           parameters: Mapping[str, Mapping[str, Any]], allow_text: bool) -> RenderedPrompt:
        """The tools as a JSON list in ``<tools>`` tags with the function-calling instruction small
        instruct models are commonly tuned on (SmolLM2's card uses this wording)."""
        listed = [{"name": t.name, "description": t.description.strip(),
                   "parameters": compact_type(parameters.get(t.name) or t.parameters)} for t in tools]
        lines = [JSON_TOOLS_INSTRUCTION, "", "You have access to the following tools:",
                 "<tools>" + json.dumps(listed, ensure_ascii=False) + "</tools>", "",
                 'The output MUST strictly adhere to the following format: [{"name": "func_name1", "arguments": '
                 '{"argument1": "value1"}}, ... (more tool calls as required)]']
        if allow_text:
            lines.append('If no function call is needed, answer {"content": "<your answer>"}.')
        text = self._apply(self._with_system(msgs, "\n".join(lines)))
        return RenderedPrompt(text=text, template_tools=self.template_tools)

    def render_plain(self, messages: Sequence[Mapping[str, Any]]) -> RenderedPrompt:
        """The prompt for an unconstrained text answer (``tool_choice="none"``)."""
        msgs = self.call_format.template_messages(messages) if self.call_format is not None else \
            template_messages(messages, template_tools=self.template_tools)
        return RenderedPrompt(text=self._apply(msgs), template_tools=self.template_tools)

    def render_json(self, messages: Sequence[Mapping[str, Any]], schema: Mapping[str, Any]) -> RenderedPrompt:
        """The prompt for structured output that must match ``schema``."""
        msgs = template_messages(messages, template_tools=self.template_tools)
        instruction = f"Reply with JSON only, of this shape: {compact_type(schema)}"
        return RenderedPrompt(text=self._apply(self._with_system(msgs, instruction)), template_tools=self.template_tools)
