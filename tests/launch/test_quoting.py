"""The template filters: every text survives its quoting exactly, comments stay one printable line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.launch.quoting import in_dquotes, integer, one_line, plain_name, sh, yaml_scalar

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
"""Any text a YAML or JSON file could hold (lone surrogates cannot be encoded at all)."""


@given(TEXT)
def test_a_yaml_scalar_loads_back_as_the_same_string_in_one_document(text: str) -> None:
    scalar = yaml_scalar(text)
    assert "\n" not in scalar and scalar.isascii()
    docs = list(yaml.safe_load_all(f"key: {scalar}  # comment\nother: 1\n"))
    assert docs == [{"key": text, "other": 1}]


@given(TEXT)
def test_a_comment_stays_one_printable_line(text: str) -> None:
    line = one_line(text)
    assert line.isprintable() or line == ""
    assert len(line.splitlines()) <= 1 and len(f"# {line}\n".splitlines()) == 1
    assert yaml.safe_load(f"# {line}\nkey: 1\n") == {"key": 1}


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30))
def test_a_shell_word_expands_to_exactly_the_text(text: str) -> None:
    proc = subprocess.run(["bash", "-c", f"printf %s {sh(text)}"], capture_output=True, check=True)
    assert proc.stdout == text.encode("utf-8", "surrogateescape")


@pytest.mark.parametrize("good", ["paraplan-0123abcd", "v1.2.3", "NCCL_IB_SL", "--tensor-model-parallel-size"])
def test_plain_names_pass(good: str) -> None:
    assert plain_name(good) == good


@pytest.mark.parametrize("bad", ["", "a b", "a\nb", "$(x)", "a;b", "é"])
def test_other_names_are_errors(bad: str) -> None:
    with pytest.raises(ValueError, match="not a plain name"):
        plain_name(bad)


def test_integers_and_double_quoted_words_are_checked() -> None:
    assert integer(8) == "8"
    for bad in (True, "8", 8.0):
        with pytest.raises(ValueError, match="not an integer"):
            integer(bad)
    assert in_dquotes("/opt/megatron-lm") == "/opt/megatron-lm"
    for bad in ('a"b', "$(x)", "`x`", "a}b", "a\\b", "a\nb"):
        with pytest.raises(ValueError, match="double-quoted"):
            in_dquotes(bad)


def test_every_template_value_goes_through_a_quoting_or_checking_filter() -> None:
    import re
    from importlib import resources

    allowed = {"sh", "shword", "sh_comment", "yaml", "name", "integer", "in_dquotes", "env_default(name)"}
    templates = resources.files("paraplan.launch").joinpath("templates")
    seen = 0
    for item in templates.iterdir():
        if not item.name.endswith(".j2"):
            continue
        for expr in re.findall(r"{{(.*?)}}", item.read_text(encoding="utf-8")):
            last = expr.rsplit("|", 1)[-1].strip() if "|" in expr else None
            assert last in allowed, f"{item.name}: {{{{{expr}}}}} is interpolated without a quoting filter"
            seen += 1
    assert seen > 50


@pytest.mark.parametrize("value", ["/lustre/data", "a b", "x$HOME", "it's", 'q"uote', "back\\slash", "br}ace", "`id`"])
def test_site_env_default_yields_to_the_users_environment(value: str, tmp_path: Path) -> None:
    from paraplan.launch.render import _env_default

    line = _env_default(value, "DATA_PATH")
    script = tmp_path / "env.sh"
    script.write_text(line + "\n", encoding="utf-8")
    show = f'source {script} && printf "%s" "$DATA_PATH"'
    base = {"PATH": "/usr/bin:/bin"}
    assert subprocess.run(["bash", "-c", show], env=base, capture_output=True, text=True,
                          check=True).stdout == value
    assert subprocess.run(["bash", "-c", show], env={**base, "DATA_PATH": "/mine"}, capture_output=True, text=True,
                          check=True).stdout == "/mine"
    if not set(value) & set("$`\"\\}'"):
        assert line == f'export DATA_PATH="${{DATA_PATH:-{value}}}"'
