"""A quiet console: the install and every decision raise no deprecation warnings of ours to fix."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_package_metadata_raises_no_setuptools_warning():
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), REPO / "pyproject.toml")
    assert [str(w.message) for w in caught] == []
    assert dist.metadata.license_expression == "Apache-2.0"


def test_scoring_a_decision_raises_no_cache_deprecation(tmp_path, caplog):
    from decider.embedded import EmbeddedEngine
    from decider.model import ModelError, resolve_model_path, tiny_random_model

    try:
        resolve_model_path(None, pull=False)  # the tiny model borrows the default model's tokenizer
    except ModelError as exc:
        pytest.skip(str(exc))
    engine = EmbeddedEngine.load(tiny_random_model(tmp_path / "tiny"))
    try:
        with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
            warnings.simplefilter("always")
            scores = engine.score_continuations("Hello", ['{"name": "a"', "Hi there"])
    finally:
        engine.close()
    assert len(scores) == 2 and all(score < 0 for score in scores)
    noise = [str(w.message) for w in caught] + [record.getMessage() for record in caplog.records]
    assert not [text for text in noise if "past_key_values" in text or "deprecated" in text], noise
