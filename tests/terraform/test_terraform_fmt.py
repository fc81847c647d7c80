"""`terraform fmt` layout (two-space indent, aligned `=`), checked without the terraform binary."""

from __future__ import annotations

import pytest
from tf_fmt_cases import ALIGNED, HEREDOC, MISALIGNED, MULTILINE_BREAKS_CHAIN, WRONG_INDENT
from tf_hclfmt import check_hcl
from tf_parse import REPO, hcl_files


@pytest.mark.parametrize("path", hcl_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_file_is_formatted(path):
    problems = check_hcl(path.read_text())
    assert not problems, "\n".join(f"{path.name}: {p}" for p in problems)


def test_checker_accepts_formatted_code():
    assert check_hcl(ALIGNED) == []
    assert check_hcl(MULTILINE_BREAKS_CHAIN) == []
    assert check_hcl(HEREDOC) == []


def test_checker_reports_misaligned_equals():
    problems = check_hcl(MISALIGNED)
    assert [p.line for p in problems] == [3]
    assert "aligned" in problems[0].message


def test_checker_reports_wrong_indentation():
    problems = check_hcl(WRONG_INDENT)
    assert [(p.line, p.message) for p in problems] == [(3, "indent 4, expected 2"), (7, "indent 3, expected 4")]


def test_checker_reports_trailing_whitespace_and_missing_newline():
    problems = check_hcl('a = 1 \nb = 2')
    assert {p.message for p in problems} == {"trailing whitespace", "file must end with a newline"}
