"""The tuned decision-quality set (dev/holdout) is well-formed and the harness measures what it claims to (no model).

The unseen split has its own checks in ``test_unseen_split.py``; the new metrics theirs in
``test_quality_metrics.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # bench/ is a plain directory, not an installed package
    sys.path.insert(0, str(ROOT))

from bench import quality  # noqa: E402
from bench.quality import EmptyDecider, OracleDecider, run_cases  # noqa: E402
from bench.quality_cases import DATA_DIR, Case, load_cases, split_of  # noqa: E402
from bench.quality_scoring import grouped_summary, score_row, summarize  # noqa: E402
from bench.toolsets import TOOLSETS, TUNED_TOOLSETS, builtin_specs, load_toolset, spec_map  # noqa: E402
from decider.protocol import DecideRequest, Decision  # noqa: E402
from tools.calls import ToolCall  # noqa: E402

ALL_CASES = load_cases(split="all")
#: The rows the decider was developed against; the unseen split is checked on its own.
CASES = [c for c in ALL_CASES if c.split != "unseen"]
CJK = re.compile(r"[\u4e00-\u9fff]")


# ---------------------------------------------------------------------------------------------
# the data
# ---------------------------------------------------------------------------------------------


def test_at_least_150_rows_half_chinese_half_english_over_three_tool_sets():
    assert len(CASES) >= 150
    langs = Counter(c.lang for c in CASES)
    assert set(langs) == {"zh", "en"} and langs["zh"] == langs["en"]
    toolsets = Counter(c.toolset for c in CASES)
    assert set(toolsets) == set(TUNED_TOOLSETS) and len(toolsets) >= 3
    assert all(n >= 40 for n in toolsets.values()), toolsets
    for toolset in toolsets:
        per_lang = Counter(c.lang for c in CASES if c.toolset == toolset)
        assert per_lang["zh"] == per_lang["en"], (toolset, per_lang)


def test_rows_have_the_documented_fields_and_unique_ids():
    required = {"id", "group", "toolset", "lang", "split", "messages", "expected_calls", "tags"}
    ids = []
    for path in sorted(DATA_DIR.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            assert required <= set(row), (path.name, row.get("id"))
            assert row["toolset"] == path.stem.removeprefix("unseen_")
            assert (row["split"] == "unseen") == path.stem.startswith("unseen_"), row["id"]
            ids.append(row["id"])
    assert len(ids) == len(set(ids)) == len(ALL_CASES)


def test_messages_are_chat_turns_ending_with_the_user_in_the_rows_language():
    for case in CASES:
        assert case.messages and case.messages[-1]["role"] == "user", case.id
        assert all(m["role"] in {"user", "assistant", "system"} and m["content"].strip() for m in case.messages), case.id
        user_text = " ".join(m["content"] for m in case.messages if m["role"] == "user")
        if case.lang == "zh":
            assert CJK.search(user_text), case.id
        else:
            assert not CJK.search(user_text), case.id


def test_every_expected_call_is_valid_against_its_tool_schema():
    for case in CASES:
        specs = spec_map(case.toolset)
        for call in case.expected_calls:
            assert set(call) == {"name", "arguments"}, case.id
            assert call["name"] in specs, (case.id, call["name"])
            schema = specs[call["name"]].parameters
            validator = jsonschema.validators.validator_for(schema)(schema)
            errors = [e.message for e in validator.iter_errors(call["arguments"])]
            assert not errors, (case.id, call, errors)


def test_holdout_is_about_40_percent_and_fixed_by_a_hash_of_the_group():
    for case in CASES:
        assert case.split == split_of(case.group), case.id
        assert case.id.startswith(case.group)
    holdout = sum(c.split == "holdout" for c in CASES) / len(CASES)
    assert 0.32 <= holdout <= 0.48, holdout
    for toolset in TUNED_TOOLSETS:
        splits = Counter(c.split for c in CASES if c.toolset == toolset)
        assert splits["dev"] and splits["holdout"], (toolset, splits)
    # zh/en twins of one scenario share a group and therefore a split
    groups = Counter(c.group for c in CASES)
    assert set(groups.values()) == {2}
    assert {(c.group, c.lang) for c in CASES} == {(g, lang) for g in groups for lang in ("zh", "en")}


def test_tags_agree_with_the_expected_calls():
    for case in CASES:
        n = len(case.expected_calls)
        assert ("no_call" in case.tags) == (n == 0), case.id
        assert ("single" in case.tags) == (n == 1), case.id
        assert ("parallel" in case.tags) == (n >= 2), case.id
        if n == 0:
            assert {"missing_required", "unacceptable_value", "no_tool"} & set(case.tags), case.id


@pytest.mark.parametrize("split", ["dev", "holdout"])
def test_each_split_covers_the_hard_cases(split):
    rows = [c for c in CASES if c.split == split]
    tags = Counter(t for c in rows for t in c.tags)
    for tag in ("single", "parallel", "no_call", "missing_required", "unacceptable_value", "alias", "decimal",
                "chinese_name", "enum_alias", "multi_turn"):
        assert tags[tag] >= 2, (split, tag, tags)
    call_counts = Counter(len(c.expected_calls) for c in rows)
    assert call_counts[2] and call_counts[3], (split, call_counts)


def test_the_set_names_the_classic_traps():
    by_text = {c.messages[-1]["content"]: c for c in CASES}
    assert by_text["北京后天天气怎么样"].expected_calls == []  # 后天 is not today|tomorrow
    assert by_text["What's the weather like in Tokyo the day after tomorrow?"].expected_calls == []
    assert by_text["沪今天多少度？"].expected_calls == [{"name": "get_weather", "arguments": {"city": "Shanghai", "date": "today"}}]


def test_builtin_specs_are_the_platforms_own():
    from bench import toolsets
    from tools.registry import default_registry

    assert [s.name for s in builtin_specs()] == list(toolsets.BUILTIN_TOOL_NAMES)
    assert all(s == default_registry().get(s.name) for s in builtin_specs())  # the test session enables all


def test_the_cli_runs_with_the_demo_tools_off(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TOOLRAIL_DEMO_TOOLS"} | {"PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "bench.quality", "--decider", "oracle", "--split", "dev", "--toolset",
                          "builtin", "--limit", "4", "--quiet", "--out", str(tmp_path / "r.json")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "| dev / builtin | 4 | 100.0 % |" in run.stdout


def test_eval_tool_sets_are_strict_and_carry_extensions():
    for name in ("calendar", "orders"):
        for spec in load_toolset(name):
            assert spec.parameters["additionalProperties"] is False
            props = spec.parameters["properties"]
            assert any(p.get("x-grounded") for p in props.values()), spec.name
    book = spec_map("calendar")["book_room"].parameters["properties"]
    assert "极光厅" in book["room"]["x-enum-aliases"]["aurora"]
    assert book["duration_minutes"]["default"] == 60


# ---------------------------------------------------------------------------------------------
# the metrics
# ---------------------------------------------------------------------------------------------


def _case(expected, *, toolset="builtin", id="t-01-zh"):
    return Case(id=id, group=id[:-3], toolset=toolset, lang="zh", split="dev",
                messages=[{"role": "user", "content": "x"}], expected_calls=expected)


def _weather(city, date, **extra):
    return {"name": "get_weather", "arguments": {"city": city, "date": date, **extra}}


def _transfer(frm, to, amount, currency):
    return {"name": "transfer", "arguments": {"from_account": frm, "to": to, "amount": amount, "currency": currency}}


def test_oracle_scores_100_percent_everywhere():
    results = run_cases(OracleDecider(ALL_CASES), ALL_CASES)
    for label, s in grouped_summary(results).items():
        assert s["exact"] == 1.0 and s["count_acc"] == 1.0, label
        assert s["valid"] == 1.0 and s["field_acc"] == 1.0, label
        assert s["wrong_call_rate"] == 0.0 and s["missed_call_rate"] == 0.0, label
        assert s["wrong_side_effect_calls"] == 0 and s["compositions"][0] == s["compositions"][1], label
        assert s["errors"] == 0


def test_empty_is_exact_only_on_no_call_rows():
    results = run_cases(EmptyDecider(), CASES)
    s = summarize(results)
    no_call = sum(1 for c in CASES if not c.expected_calls)
    assert s["exact"] == pytest.approx(no_call / len(CASES))
    assert all(r.exact == (not r.expected) for r in results)
    assert s["missed_call_rate"] == 1.0 and s["wrong_call_rate"] == 0.0
    assert s["field_acc"] == 0.0 and s["valid"] is None and s["no_call_rows_exact"] == 1.0


def test_aliases_defaults_and_numbers_are_canonicalized():
    case = _case([_weather("Shanghai", "today"), _transfer("储蓄账户", "李娜", 100, "CNY")])
    predicted = [_transfer(" 储蓄账户", "李娜", 100.0, "CNY"), _weather("沪", "today", unit="celsius")]
    result = score_row(case, predicted)
    assert result.exact and result.valid_calls == 2 and result.fields_correct == result.fields_total == 7
    assert score_row(case, [_weather("shanghai", "today"), _transfer("储蓄账户", "李娜", 100.001, "CNY")]).exact is False


def test_order_of_parallel_calls_does_not_matter_but_multiplicity_does():
    case = _case([_weather("Shanghai", "today"), _weather("Shanghai", "tomorrow")])
    assert score_row(case, [_weather("Shanghai", "tomorrow"), _weather("Shanghai", "today")]).exact
    twice = score_row(case, [_weather("Shanghai", "today"), _weather("Shanghai", "today")])
    assert not twice.exact and twice.wrong_calls == 0 and twice.missed_calls == 0
    assert (twice.fields_correct, twice.fields_total) == (5, 6)  # one date wrong of 3 fields × 2


def test_wrong_and_missed_calls_are_counted_by_tool():
    case = _case([_transfer("a", "b", 5, "USD")])
    extra = score_row(case, [_transfer("a", "b", 5, "USD"), {"name": "query_balance", "arguments": {"account": "a"}}])
    assert not extra.exact and (extra.wrong_calls, extra.missed_calls, extra.predicted_calls) == (1, 0, 2)
    swapped = score_row(case, [{"name": "query_balance", "arguments": {"account": "a"}}])
    assert (swapped.wrong_calls, swapped.missed_calls, swapped.fields_correct) == (1, 1, 0)
    none_expected = score_row(_case([]), [_weather("Beijing", "today")])
    assert not none_expected.exact and none_expected.wrong_calls == 1
    s = summarize([extra, swapped, none_expected])
    assert s["wrong_call_rate"] == pytest.approx(3 / 4) and s["missed_call_rate"] == pytest.approx(1 / 2)


def test_schema_invalid_calls_are_never_exact():
    case = _case([_weather("Beijing", "tomorrow")])
    # 明天 canonicalizes to tomorrow (an x-alias), but the call itself breaks the enum
    result = score_row(case, [_weather("Beijing", "明天")])
    assert result.valid_calls == 0 and not result.exact
    unknown = score_row(case, [{"name": "get_forecast", "arguments": {"city": "Beijing"}}])
    assert unknown.valid_calls == 0 and unknown.wrong_calls == 1 and unknown.missed_calls == 1
    broken = score_row(case, [ToolCall(id="c", index=0, name="get_weather", arguments=None, raw_arguments="{")])
    assert broken.valid_calls == 0 and broken.wrong_calls == 0 and broken.fields_correct == 0


def test_per_field_accuracy_pairs_calls_to_agree_most():
    case = _case([_transfer("a", "b", 5, "USD"), _transfer("a", "c", 7.5, "EUR")])
    result = score_row(case, [_transfer("a", "c", 7.5, "USD"), _transfer("a", "b", 5, "USD")])
    assert (result.fields_correct, result.fields_total) == (7, 8)
    assert result.field_scores["transfer.currency"] == [1, 2]
    assert result.field_scores["transfer.to"] == [2, 2]


def test_eval_tool_set_defaults_and_numeric_counts():
    case = _case([{"name": "book_room", "arguments": {"room": "aurora", "date": "2025-07-03", "start_time": "14:00",
                                                      "attendees": 6}}], toolset="calendar")
    explicit = {"name": "book_room", "arguments": {"room": "aurora", "date": "2025-07-03", "start_time": "14:00",
                                                   "attendees": 6.0, "duration_minutes": 60}}
    # 6.0 is 6 (JSON Schema counts a float with no fraction as an integer), the default 60 is implied
    result = score_row(case, [explicit])
    assert result.fields_correct == result.fields_total == 5 and result.exact
    explicit["arguments"]["attendees"] = 6.5
    result = score_row(case, [explicit])
    assert result.valid_calls == 0 and not result.exact and result.field_scores["book_room.attendees"] == [0, 1]


class _Raising:
    def decide(self, request: DecideRequest) -> Decision:
        raise RuntimeError("backend down")


class _Misrouted:
    def decide(self, request: DecideRequest) -> Decision:
        return Decision(request_id="someone-else", raw_output="")


def test_errors_and_misrouted_decisions_are_scored_rows():
    cases = CASES[:3]
    raising = run_cases(_Raising(), cases)
    assert all(r.error and "backend down" in r.error and r.predicted == [] for r in raising)
    misrouted = run_cases(_Misrouted(), cases)
    assert all(r.error and "someone-else" in r.error for r in misrouted)
    assert summarize(raising)["errors"] == 3


def test_the_decider_sees_the_conversation_and_tools_but_not_the_answer():
    request = quality.request_for(CASES[0])
    assert request.request_id == CASES[0].id and request.messages == CASES[0].messages
    assert [t.name for t in request.tools] == [t.name for t in load_toolset(CASES[0].toolset)]
    assert "expected" not in json.dumps(request.model_dump(mode="json", exclude={"tools"}))


def test_filters_and_limit_keep_a_mix():
    assert {c.split for c in load_cases(split="holdout")} == {"holdout"}
    assert {c.lang for c in load_cases(lang="zh", toolset="orders")} == {"zh"}
    limited = load_cases(split="all", limit=12)
    assert len(limited) == 12 and {c.toolset for c in limited} == set(TOOLSETS)
    assert {c.split for c in limited} == {"dev", "holdout", "unseen"}
    assert {c.split for c in load_cases(split="unseen")} == {"unseen"}


def test_cli_prints_a_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert quality.main(["--decider", "oracle", "--split", "all", "--quiet", "--out", str(out), "--tags"]) == 0
    printed = capsys.readouterr().out
    assert "| holdout / orders |" in printed and "| dev / zh |" in printed
    # the split nothing was tuned on is reported first
    assert printed.index("| unseen |") < printed.index("| holdout |") < printed.index("| dev |")
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["rows"] == len(ALL_CASES)
    assert report["runs"][0]["groups"]["holdout"]["exact"] == 1.0
    assert report["runs"][0]["wrong_side_effect_calls"] == 0
    assert set(report["runs"][0]["headlines"]) == {"unseen", "holdout", "dev"}


def test_cli_ladder_runs_each_technique(tmp_path, capsys, monkeypatch):
    seen = []

    def factory(technique=None, **_):
        seen.append(technique)
        return EmptyDecider()

    monkeypatch.setitem(quality.DECIDERS, "fake", factory)
    quality.main(["--decider", "fake", "--technique", "a,b", "--limit", "6", "--quiet", "--out", str(tmp_path / "r.json")])
    assert seen == ["a", "b"]
    assert "| a / dev |" in capsys.readouterr().out


def test_techniques_are_presets_or_config_overrides():
    assert quality.TECHNIQUES == {"grammar": {"candidates": False}, "candidates": {"candidates": True}}
    assert quality._parse_technique("grammar", quality.TECHNIQUES) == {"candidates": False}
    assert quality._parse_technique("candidates=false+max_calls=2+system_prompt=hi", quality.TECHNIQUES) == {
        "candidates": False, "max_calls": 2, "system_prompt": "hi"}
    with pytest.raises(SystemExit):
        quality._parse_technique("nonsense", quality.TECHNIQUES)


def test_the_embedded_factory_passes_only_the_rung_overrides(monkeypatch):
    """A rung is keyword overrides of whatever DeciderConfig the decider defines, nothing more."""
    import types

    seen = {}

    class Config:
        def __init__(self, **overrides):
            seen.update(overrides)

    class Decider:
        @classmethod
        def from_engine(cls, engine, *, config):
            return (engine, config)

    fake = types.SimpleNamespace(DeciderConfig=Config, EmbeddedDecider=Decider)
    monkeypatch.setattr(quality.importlib, "import_module", lambda name: fake)
    monkeypatch.setitem(quality._ENGINES, "engine", "an engine")
    engine, _ = quality._embedded_factory(technique="grammar")
    assert engine == "an engine" and seen == {"candidates": False}


def test_the_embedded_decider_runs_behind_the_platforms_check_loop_when_there_is_one(monkeypatch):
    import types

    class Decider:
        @classmethod
        def from_engine(cls, engine, *, config):
            return cls()

        def plan(self, request):
            return "its own plan"

    looped = []
    modules = {"decider.service": types.SimpleNamespace(DeciderConfig=lambda **_: None, EmbeddedDecider=Decider),
               "decider.checked": types.SimpleNamespace(decide_checked=lambda decider, request: looped.append(request))}
    monkeypatch.setattr(quality.importlib, "import_module", modules.__getitem__)
    monkeypatch.setitem(quality._ENGINES, "engine", "an engine")
    wrapped = quality._embedded_factory()
    assert isinstance(wrapped, quality.PlatformChecked) and wrapped.plan("r") == "its own plan"
    wrapped.decide_checked("r")
    assert looped == ["r"]
    del modules["decider.checked"]

    def missing(name):
        if name not in modules:
            raise ImportError(name)
        return modules[name]

    monkeypatch.setattr(quality.importlib, "import_module", missing)
    assert isinstance(quality._embedded_factory(), Decider)


def test_cli_reruns_chosen_ids(tmp_path, capsys):
    quality.main(["--decider", "oracle", "--split", "all", "--ids", "bi-01-zh,ord-03-en", "--quiet",
                  "--out", str(tmp_path / "r.json")])
    report = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
    assert sorted(r["id"] for r in report["runs"][0]["rows"]) == ["bi-01-zh", "ord-03-en"]
