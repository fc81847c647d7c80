"""The stack's shape: standard module layout, typed and described interfaces, envs wired to
modules through inputs and outputs that exist."""

from __future__ import annotations

import re

import pytest
from tf_parse import ENV_NAMES, ENVS, META_ARGUMENTS, MODULE_NAMES, MODULES, REPO, expr, hcl_files, parse_file, unquote

MODULE_REF = re.compile(r"\bmodule\.([a-z_][a-z0-9_]*)\.([a-z_][a-z0-9_]*)")


@pytest.mark.parametrize("module", MODULE_NAMES)
def test_module_has_standard_files(module):
    present = {p.name for p in (MODULES / module).iterdir()}
    assert {"main.tf", "variables.tf", "outputs.tf", "versions.tf", "README.md"} <= present


@pytest.mark.parametrize("path", hcl_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_hcl_file_parses(path):
    assert isinstance(parse_file(path), dict)


def test_every_variable_is_typed_and_described(stack):
    problems = []
    for config in stack.all_configs():
        assert config.variables, f"{config.path} declares no variables"
        for name, body in config.variables.items():
            if "type" not in body:
                problems.append(f"{config.path.name}: var.{name} has no type")
            if len(unquote(body.get("description", "")).strip()) < 10:
                problems.append(f"{config.path.name}: var.{name} has no real description")
    assert not problems, problems


def test_every_output_is_described_and_not_sensitive(stack):
    problems = []
    for config in stack.all_configs():
        for name, body in config.outputs.items():
            if len(unquote(body.get("description", "")).strip()) < 10:
                problems.append(f"{config.path.name}: output {name} has no description")
            value = expr(body["value"])
            if re.search(r"random_password|secret_string|auth_token|\.result\b", value):
                problems.append(f"{config.path.name}: output {name} exposes a secret: {value}")
            if body.get("sensitive") is True:
                problems.append(f"{config.path.name}: output {name} is a secret; outputs carry ARNs, not values")
    assert not problems, problems


@pytest.mark.parametrize("module", MODULE_NAMES)
def test_module_readme_documents_every_input_and_output(stack, module):
    readme = (MODULES / module / "README.md").read_text()
    config = stack.modules[module]
    assert "## Inputs" in readme and "## Outputs" in readme
    missing = [n for n in [*config.variables, *config.outputs] if f"| `{n}` |" not in readme]
    assert not missing, f"README of {module} lacks table rows for {missing}"


@pytest.mark.parametrize("env", ENV_NAMES)
def test_env_module_calls_match_module_interfaces(stack, env):
    calls = stack.envs[env].module_calls
    assert set(calls) == set(MODULE_NAMES)
    for call_name, body in calls.items():
        source = unquote(body["source"])
        target = (ENVS / env / source).resolve()
        assert target.parent == MODULES.resolve(), f"module {call_name} sources {source}, outside terraform/modules"
        module = stack.modules[target.name]
        arguments = {k for k in body if k not in META_ARGUMENTS}
        unknown = arguments - set(module.variables)
        assert not unknown, f"{env}: module.{call_name} passes undeclared inputs {unknown}"
        required = {n for n, v in module.variables.items() if "default" not in v}
        assert required <= arguments, f"{env}: module.{call_name} misses required inputs {required - arguments}"


@pytest.mark.parametrize("env", ENV_NAMES)
def test_env_references_only_existing_module_outputs(stack, env):
    calls = stack.envs[env].module_calls
    references = MODULE_REF.findall(stack.envs[env].text())
    assert references, "the env wires no module outputs"
    for call_name, output in references:
        module = (ENVS / env / unquote(calls[call_name]["source"])).resolve().name
        assert output in stack.modules[module].outputs, f"{env}: module.{call_name}.{output} is not an output of {module}"


def test_dev_and_prod_compose_the_same_stack():
    for name in ("main.tf", "variables.tf", "outputs.tf"):
        assert (ENVS / "dev" / name).read_text() == (ENVS / "prod" / name).read_text(), f"{name} drifted between envs"


@pytest.mark.parametrize("env", ENV_NAMES)
def test_tfvars_set_declared_variables_and_every_required_one(stack, env):
    variables = stack.envs[env].variables
    values = stack.tfvars(env)
    assert set(values) <= set(variables), f"undeclared: {set(values) - set(variables)}"
    required = {n for n, v in variables.items() if "default" not in v}
    assert required <= set(values), f"{env}.tfvars misses {required - set(values)}"
    assert values["environment"] == env


def test_versions_pin_terraform_and_providers(stack):
    for config in stack.all_configs():
        (terraform,) = config.plain_blocks("terraform")
        assert terraform["required_version"].startswith(">= 1.6")
        (providers,) = terraform["required_providers"]
        assert "aws" in providers
        for provider in providers.values():
            assert "<" in provider["version"], f"{config.path}: provider without an upper bound"


@pytest.mark.parametrize("env", ENV_NAMES)
def test_everything_is_tagged_through_default_tags(stack, env):
    (provider,) = [p["aws"] for p in stack.envs[env].plain_blocks("provider") if "aws" in p]
    tags = provider["default_tags"][0]["tags"]
    assert {"Project", "Environment", "ManagedBy"} <= set(tags)
    for module in stack.modules.values():
        assert "tags" in module.variables
