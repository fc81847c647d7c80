"""Native tool-call formats (issue 38): each family's template renders, its syntax is forced from noise, its
output parsed — a tiny random-weight model per family (``native_fixtures``), the embedded engine.

Golden tests pin the rendering against the family's template text (``native/*.jinja``) and the parsers
against hand-written outputs in each syntax.
"""

from __future__ import annotations

import json

import pytest
from native_fixtures import FAMILIES, build_family_model

from decider.protocol import DecideRequest
from decider.tool_formats import TOOL_FORMATS, MistralFormat, detect_tool_format, get_tool_format
from tools.spec import ToolSpec

WEATHER = ToolSpec.from_openai({"name": "get_weather", "description": "weather of a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                                     "days": {"type": "integer", "minimum": 1, "maximum": 3}},
    "required": ["city", "days"]}})
TIME = ToolSpec.from_openai({"name": "get_time", "description": "local time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}})


@pytest.fixture(scope="module")
def family_engines(tmp_path_factory):
    from decider.embedded import EmbeddedEngine

    engines = {name: EmbeddedEngine.load(build_family_model(name, tmp_path_factory.mktemp(name)), dtype="float32",
                                         max_batch_size=4, max_seq_len=2048) for name in FAMILIES}
    yield engines
    for engine in engines.values():
        engine.close()


def _decider(engine, **config):
    from decider.service import DeciderConfig, EmbeddedDecider

    return EmbeddedDecider.from_engine(engine, config=DeciderConfig(**config))


# ----------------------------------------------------------------------------- detection and rendering


@pytest.mark.parametrize("name", list(FAMILIES))
def test_each_family_template_is_detected_as_its_format(name, family_engines):
    tokenizer = family_engines[name].tokenizer
    assert detect_tool_format(tokenizer.chat_template).name == FAMILIES[name].tool_format
    assert _decider(family_engines[name]).call_format.name == FAMILIES[name].tool_format


def test_a_template_without_tools_keeps_the_json_array():
    smol_like = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    assert detect_tool_format(smol_like).name == "json_array"
    assert detect_tool_format(None).name == "json_array"


HISTORY = [
    {"role": "user", "content": "Weather in Paris for 2 days?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_r1_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}}]},
    {"role": "tool", "tool_call_id": "call_r1_0", "content": '{"temp_c": 21}'},
]


def test_qwen_renders_tools_calls_and_results_with_its_own_template(family_engines):
    decider = _decider(family_engines["qwen2"])
    text = decider.plan(DecideRequest(request_id="g1", messages=HISTORY, tools=[WEATHER])).prompt
    assert "# Tools\n\nYou may call one or more functions" in text
    assert json.dumps(WEATHER.to_openai()) in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call><|im_end|>' in text
    assert '<|im_start|>user\n<tool_response>\n{"temp_c": 21}\n</tool_response><|im_end|>\n<|im_start|>assistant\n' in text
    assert "Reply with a JSON array" not in text  # the platform's own instruction is not added


def test_llama_renders_calls_as_name_parameters_and_results_as_ipython(family_engines):
    decider = _decider(family_engines["llama"])
    text = decider.plan(DecideRequest(request_id="g2", messages=HISTORY, tools=[WEATHER])).prompt
    assert 'Respond in the format {"name": function name, "parameters":' in text
    assert '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}<|eot_id|>' in text
    assert '<|start_header_id|>ipython<|end_header_id|>\n\n{"temp_c": 21}<|eot_id|>' in text


def test_mistral_renders_available_tools_and_nine_character_call_ids(family_engines):
    decider = _decider(family_engines["mistral"])
    text = decider.plan(DecideRequest(request_id="g3", messages=HISTORY, tools=[WEATHER])).prompt
    short = MistralFormat.short_id("call_r1_0")
    assert len(short) == 9 and short.isalnum()
    assert text.startswith('<s>[AVAILABLE_TOOLS] [{"type": "function", "function": {"name": "get_weather"')
    assert f'[TOOL_CALLS] [{{"name": "get_weather", "arguments": {{"city": "Paris", "days": 2}}, "id": "{short}"}}]</s>' in text
    assert f'[TOOL_RESULTS] {{"content": {{"temp_c": 21}}, "call_id": "{short}"}}[/TOOL_RESULTS]' in text


# ----------------------------------------------------------------------------- parsers (golden outputs)

GOLDEN = {
    "hermes": ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 1}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'),
    "llama3_json": '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome", "days": 1}}; '
                   '{"name": "get_time", "parameters": {"zone": "CET"}}',
    "mistral": '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Rome", "days": 1}}, '
               '{"name": "get_time", "arguments": {"zone": "CET"}}]',
    "json_array": '[{"name": "get_weather", "arguments": {"city": "Rome", "days": 1}}, '
                  '{"name": "get_time", "arguments": {"zone": "CET"}}]',
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_each_parser_reads_two_calls_of_its_syntax(name):
    parser = get_tool_format(name).parser("req-9", attempt=1)
    deltas = []
    text = GOLDEN[name]
    for start in range(0, len(text), 7):  # streamed in pieces: the same calls as a whole
        deltas += parser.feed(text[start:start + 7])
    parsed = parser.finish()
    assert parsed.problem is None
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("get_weather", {"city": "Rome", "days": 1}), ("get_time", {"zone": "CET"})]
    assert [c.index for c in parsed.tool_calls] == [0, 1]
    assert len({c.id for c in parsed.tool_calls}) == 2 and all("req-9" in c.id for c in parsed.tool_calls)
    assert [d.name for d in deltas if d.name] == ["get_weather", "get_time"]


def test_native_parsers_read_text_answers_and_open_calls():
    hermes = get_tool_format("hermes")
    assert hermes.scan("It is sunny.").content == "It is sunny." and not hermes.scan("It is sunny.").calls
    cut = hermes.parser("r").feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Ro')
    assert cut == []
    parser = hermes.parser("r")
    parser.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Ro')
    assert parser.finish().problem and parser.finish().tool_calls[0].arguments is None
    # a server whose detokenizer drops the special [TOOL_CALLS] token still yields Mistral's calls
    dropped = get_tool_format("mistral").scan(' [{"name": "get_time", "arguments": {"zone": "UTC"}}]')
    assert [c.name for c in dropped.calls] == ["get_time"]


def test_every_registered_format_has_a_distinct_name():
    assert sorted(TOOL_FORMATS) == ["hermes", "json_array", "llama3_json", "mistral"]


# ----------------------------------------------------------------------------- forced from noise


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_grammar_forces_well_formed_native_calls_from_a_random_model(name, family_engines):
    decider = _decider(family_engines[name])
    request = DecideRequest(request_id=f"noise-{name}", messages=[{"role": "user", "content": "Weather in Rome?"}],
                            tools=[WEATHER, TIME], tool_choice="required", max_tokens=120, max_calls=1)
    decision = decider.decide(request)
    fmt = get_tool_format(FAMILIES[name].tool_format)
    assert decision.platform["tool_format"] == fmt.name
    assert decision.tool_calls, decision.raw_output
    for call in decision.tool_calls:
        spec = {"get_weather": WEATHER, "get_time": TIME}[call.name]
        assert spec.validate_arguments(call.arguments) == [] if hasattr(spec, "validate_arguments") else call.arguments
    if name == "qwen2":
        assert decision.raw_output.startswith('<tool_call>\n{"name": "')
    if name == "llama":
        assert decision.raw_output.startswith('{"name": "')
    if name == "mistral":
        assert decision.raw_output.startswith('[TOOL_CALLS] [{')


# ----------------------------------------------------------------------------- the Triton path


@pytest.fixture(scope="module")
def triton_family_deciders(family_engines, tmp_path_factory):
    """Per family: the decider's Triton client → the wire-protocol double (built from tensorrtllm_backend v0.19.0's
    release code, serving a repository written for the family's tokenizer) → the family's engine, guided by what
    the client sent (here the structural tag's EBNF, guide type ``ebnf_grammar``)."""
    from test_triton_backend import RELEASE_V0190, _ServerThread
    from triton_double import TritonProtocolDouble, engine_generator

    from decider.service import BackendDecider, DeciderConfig
    from decider.triton import TritonBackend
    from engine_build.triton_repo import RepoOptions, write_triton_repo

    out, servers = {}, []
    for name, engine in family_engines.items():
        root = tmp_path_factory.mktemp(f"triton-{name}")
        written = write_triton_repo(RepoOptions(flavor="engine", output=root, model="/models/tiny",
                                                engine_dir="/engines/tiny", model_code_from=RELEASE_V0190),
                                    engine.tokenizer, stop_token_ids=sorted(engine.eos_token_ids))
        manifest = json.loads((written.root / "toolrail_repo_manifest.json").read_text())
        assert manifest["tool_call_format"] == FAMILIES[name].tool_format  # what `engine triton-repo` records
        double = TritonProtocolDouble(root, engine_generator(engine), seed=3)
        server = _ServerThread(double)
        servers.append(server)
        backend = TritonBackend(url=server.url, model_name="tensorrt_llm_bls", request_timeout_s=60,
                                context_length=engine.context_length)
        out[name] = (BackendDecider(backend, tokenizer=engine.tokenizer, context_length=engine.context_length,
                                    config=DeciderConfig(candidates=False)), double)
    yield out
    for server in servers:
        server.stop()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_triton_path_sends_the_native_constraint_as_ebnf_and_parses_the_family_syntax(name, triton_family_deciders):
    decider, double = triton_family_deciders[name]
    request = DecideRequest(request_id=f"tri-{name}", messages=[{"role": "user", "content": "Time in CET?"}],
                            tools=[WEATHER, TIME], tool_choice="required", max_tokens=120, max_calls=1)
    plan = decider.plan(request)
    assert plan.compiled is None and plan.ebnf.startswith("root ::= call\n")  # the calls alone, as EBNF text
    decision = decider.decide(request)
    assert double.stats.rejected == []
    assert decision.backend == "triton" and decision.platform["tool_format"] == FAMILIES[name].tool_format
    assert len(decision.tool_calls) == 1 and decision.tool_calls[0].name in {"get_weather", "get_time"}
    assert decision.tool_calls[0].arguments is not None, decision.raw_output


# ----------------------------------------------------------------------------- clients' native raw_output


@pytest.mark.parametrize("name", ["hermes", "llama3_json", "mistral"])
def test_a_clients_native_raw_output_is_checked_with_its_familys_parser(name):
    from decider.checked import _check_client

    specs = {"get_weather": WEATHER, "get_time": TIME}
    _raw, check = _check_client(GOLDEN[name], specs, None)
    assert [c.name for c in check.calls] == ["get_weather", "get_time"]
    assert all(c.ok for c in check.calls), [c.errors for c in check.calls]
    assert check.calls[0].arguments == {"city": "Rome", "days": 1}


# ----------------------------------------------------------------------------- the EBNF a server gets

PORTABLE_CASES = {
    ("hermes", False): '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>\n'
                       '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}\n</tool_call>',
    ("hermes", True): 'Checking. <tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call> ok',
    ("llama3_json", False): '{"name": "get_time", "parameters": {"zone": "CET"}}; '
                            '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}',
    ("llama3_json", True): 'Sure {"name": "get_time", "parameters": {"zone": "CET"}}',
    ("mistral", False): '[TOOL_CALLS] [{"name": "get_time", "arguments": {"zone": "CET"}}]',
    ("mistral", True): 'One moment.[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Rome", "days": 1}}]',
}


@pytest.mark.parametrize(("name", "allow_text"), sorted(PORTABLE_CASES))
def test_the_ebnf_sent_to_a_server_is_the_formats_constraint_in_portable_syntax(name, allow_text):
    """What the Triton path sends: it accepts the format's calls and refuses a value outside a tool's schema, and
    keeps to what TensorRT-LLM 1.0's xgrammar (0.1.21) parses — a TagDispatch only as the root rule, no
    ``{n, -1}`` (checked by hand with 0.1.21: the text the newer xgrammar prints from the tag fails there)."""
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string as accepts

    from decider.schema import prepare_tool, tool_calls_schema

    tools = [(t.name, prepare_tool(t).grammar_schema) for t in (WEATHER, TIME)]
    fmt = get_tool_format(name)
    ebnf = fmt.ebnf(tools, allow_text=allow_text, max_calls=4, calls_schema=tool_calls_schema(tools, max_calls=4))
    assert ", -1}" not in ebnf
    assert [line for line in ebnf.splitlines() if "TagDispatch" in line] == (
        [line for line in ebnf.splitlines() if line.startswith("root ::= TagDispatch(")] if allow_text else [])
    grammar = xgr.Grammar.from_ebnf(ebnf)
    text = PORTABLE_CASES[(name, allow_text)]
    assert accepts(grammar, text)
    assert not accepts(grammar, text.replace('"CET"', '"PST"').replace('"Rome"', '"Oslo"').replace('"UTC"', '"PST"').replace('"Paris"', '"Oslo"'))


def test_a_clients_broken_native_output_is_not_dropped_but_read_by_the_cleaning_reader():
    """A Llama-style output with one body that is not JSON: the native reading is not whole, so the cleaning reader
    takes the text and refuses it with a typed error — never the first call run alone as if it were the output."""
    from decider.checked import _check_client

    broken = '{"name": "get_time", "parameters": {"zone": "CET"}}; {"name": "get_weather", "parameters": {"city": "Rome", "days": }}'
    _raw, check = _check_client(broken, {"get_weather": WEATHER, "get_time": TIME}, None)
    assert check.calls == [] and check.errors and check.errors[0]["validator"] == "ambiguous"


def test_the_model_manifest_overrides_the_detected_format(tmp_path):
    """``tool_call_format`` in the model directory's ``toolrail-model.json`` wins over the template (an operator
    keeping the platform's JSON array for a Qwen model); an unknown name is a clear error."""
    from transformers import AutoTokenizer

    from decider.errors import InvalidRequestError
    from decider.tool_formats import resolve_tool_format

    directory = build_family_model("qwen2", tmp_path / "qwen")
    assert resolve_tool_format(AutoTokenizer.from_pretrained(str(directory))).name == "hermes"
    (directory / "toolrail-model.json").write_text(json.dumps({"name": "tiny", "tool_call_format": "json_array"}))
    assert resolve_tool_format(AutoTokenizer.from_pretrained(str(directory))).name == "json_array"
    (directory / "toolrail-model.json").write_text(json.dumps({"tool_call_format": "harmony"}))
    with pytest.raises(InvalidRequestError, match="unknown tool-call format 'harmony'"):
        resolve_tool_format(AutoTokenizer.from_pretrained(str(directory)))
