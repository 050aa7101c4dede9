"""The CLI in a terminal: 80 columns, bare invocation, Ctrl-C, a full output device, names with escape
sequences, lazy command loading, the help of every command."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.cells import cell_len

import paraplan.cli._app as cli_app
from paraplan.cli import COMMANDS, app, load_command_modules, main

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "tests" / "fixtures" / "logs" / "01_Megatron-LM_756_turn0.log"
SBATCH = ROOT / "tests" / "launch" / "snapshots" / "llama70b" / "job.sbatch"
PLAN = ["--model", "llama3-70b", "--gpu", "h100-80gb", "--num-gpus", "64", "--seq-len", "8192", "--gbs", "512"]
HEAVY = ("numpy", "pydantic", "yaml", "plotly", "jinja2")


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def assert_fits(out: str, width: int = 80) -> None:
    """No line wider than ``width`` cells, nothing cut with an ellipsis."""
    wide = [line for line in out.splitlines() if cell_len(line) > width]
    assert not wide, f"{len(wide)} line(s) over {width} columns, e.g. {wide[0]!r}"
    assert "…" not in out


@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("NO_COLOR", raising=False)


def test_bare_paraplan_prints_the_help_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run([], capsys)
    assert code == 0
    assert "Usage: paraplan" in out and "Commands" in out
    assert err == ""


def test_root_help_lists_every_command_with_its_one_line_help(
        narrow: None, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["--help"], capsys)
    assert code == 0
    assert_fits(out)
    words = out.split()
    for name, (_, text) in COMMANDS.items():
        assert name in words
        assert all(w in words for w in text.split()), name  # every word of the help whole


def test_command_table_is_what_the_modules_register() -> None:
    """COMMANDS (read by the root help without importing anything) names each command's module and the
    first paragraph of its docstring."""
    load_command_modules()
    registered = {}
    for info in app.registered_commands:
        assert info.callback is not None and info.name
        registered[info.name] = info
    assert set(registered) == set(COMMANDS)
    for name, (module, text) in COMMANDS.items():
        callback = registered[name].callback
        assert callback is not None
        assert callback.__module__ == module, name
        first = inspect.cleandoc(inspect.getdoc(callback) or "").split("\n\n")[0]
        assert " ".join(first.split()) == text, name


def test_a_typo_suggests_among_commands_not_yet_loaded(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["calibrat"], capsys)
    assert code == 2 and "Did you mean 'calibrate'" in err  # an unknown command is a usage error


@pytest.mark.parametrize("command", list(COMMANDS))
def test_help_of_every_command_fits_80_columns_with_whole_option_names(
        command: str, narrow: None, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([command, "--help"], capsys)
    assert code == 0
    assert_fits(out)
    import typer.main

    group = typer.main.get_command(app)
    cmd = group.get_command(None, command)  # type: ignore[attr-defined]
    words = set(out.replace(",", " ").split())
    for param in cmd.params:
        if getattr(param, "hidden", False):
            continue
        for opt in [*param.opts, *param.secondary_opts]:
            if opt.startswith("-"):
                assert opt in words, f"{command}: option {opt} not printed whole"
        for word in (getattr(param, "help", None) or "").replace(",", " ").split():
            if "[" not in word:  # rich markup in a few help texts
                assert word in words, f"{command} {param.name}: help word {word!r} broken"


def test_models_and_gpus_fit_80_columns(narrow: None, capsys: pytest.CaptureFixture[str]) -> None:
    from paraplan.specs.load import gpu_preset_names, model_preset_names

    for command, names in (("models", model_preset_names()), ("gpus", gpu_preset_names())):
        code, out, _ = run([command], capsys)
        assert code == 0
        assert_fits(out)
        rows = {line.split()[0] for line in out.splitlines() if line.split()}
        assert set(names) <= rows, command  # each name whole at the start of its row


@pytest.mark.parametrize("columns", ["80", "60"])
def test_recipes_fit_narrow_terminals_with_whole_numbers(columns: str, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from paraplan.recipes.user import catalogue

    monkeypatch.setenv("COLUMNS", columns)
    code, out, _ = run(["recipes"], capsys)
    assert code == 0
    assert_fits(out, int(columns))  # no cell cut to '…' (the GPUs, seq and GBS columns were)
    header = next(line.split() for line in out.splitlines() if line.split()[:1] == ["alias"])
    assert header[1:4] == ["GPUs", "seq", "GBS"]
    shown = [r for r in catalogue() if r.runnable]
    numbers = {tuple(line.split()[1:4]) for line in out.splitlines() if len(line.split()) > 4}
    for r in shown[:20]:  # each number whole in its column
        assert (str(r.get("num_gpus")), str(r.get("seq_length")), str(r.get("global_batch_size"))) in numbers
    assert "--format json" in out


def test_models_at_full_width_shows_whole_sources(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    code, out, _ = run(["models"], capsys)
    assert code == 0 and "source" in out
    assert "deepseek-ai/DeepSeek-V3" in out


@pytest.mark.parametrize("command", ["plan", "explain"])
def test_plan_tables_keep_each_layout_on_one_line(command: str, narrow: None,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([command, *PLAN], capsys)
    assert code == 0
    assert_fits(out)
    lines = out.splitlines()
    from paraplan.cli.plan import PlanRequest, run_plan

    p = run_plan(PlanRequest(model="llama3-70b", gpu="h100-80gb", num_gpus=64, seq_len=8192, gbs=512))
    shorts = [c.layout.short() for c in p.candidates]
    assert len(shorts) == 5
    for rank, short in enumerate(shorts, 1):
        assert any(line.split()[:1] == [str(rank)] and short in line for line in lines), short


@pytest.mark.parametrize("args", [
    ["tune", "--log", str(LOG), "--model", "mixtral-8x7b", "--gpu", "h100-80gb", "--num-gpus", "16", "--seq-len",
     "4096", "--gbs", "128", "--tp", "2", "--ep", "8", "--no-search"],
    ["ingest", str(LOG)],
    ["check", str(SBATCH), "--gpu", "h100-80gb"],
    ["budget", "--model", "llama3-8b", "--tokens", "1T", "--gpu", "h100-80gb,b200", "--max-gpus", "256",
     "--price-per-gpu-hour", "h100-80gb=2.5,b200=4.5", "--days", "30"],
], ids=["tune", "ingest", "check", "budget"])
def test_command_output_fits_80_columns(args: list[str], narrow: None, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(args, capsys)
    assert code in (0, 1)  # check exits 1 when the script breaks a rule
    assert out
    assert_fits(out)


def test_tune_prints_the_launch_command_on_one_line(narrow: None, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["tune", "--log", str(LOG), "--model", "mixtral-8x7b", "--gpu", "h100-80gb", "--num-gpus",
                        "16", "--seq-len", "4096", "--gbs", "128", "--tp", "2", "--ep", "8"], capsys)
    assert code == 0
    commands = [line for line in out.splitlines() if line.startswith("paraplan launch ")]
    assert commands and all("--out " in line for line in commands)  # whole, to copy
    rest = [line for line in out.splitlines() if not line.startswith("paraplan launch ")]
    assert_fits("\n".join(rest))


def test_plan_notes_are_whole_sentences(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["plan", *PLAN, "--format", "json"], capsys)
    assert code == 0
    notes = json.loads(out)["notes"]
    assert any("Megatron-FSDP left out of" in n for n in notes)  # a long note (FSDP beyond its default scope)
    code, text, _ = run(["plan", *PLAN], capsys)
    printed = [" ".join(chunk.split()) for chunk in text.split("note: ")[1:]]
    assert printed == notes  # printed whole
    for note in notes:
        last = note.split()[-1].strip(".;:,").lower()
        assert last not in {"is", "are", "the", "a", "of", "and", "to", "with", "each", "its", "by", "for"}, note


def test_ctrl_c_exits_130_with_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import paraplan.api

    def interrupted(kind: str) -> list[str]:
        raise KeyboardInterrupt

    monkeypatch.setattr(paraplan.api, "preset_rows", interrupted)  # the CLI takes it from the API
    code, _, err = run(["gpus"], capsys)
    assert code == 130
    assert err.strip() == "interrupted"


def test_a_ctrl_c_swallowed_by_a_finalizer_still_exits_130(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Python drops a KeyboardInterrupt raised inside a finalizer; the command then finishes, but the run was
    interrupted: main() still exits 130 with one line."""
    import signal

    import paraplan.api

    real = paraplan.api.preset_rows

    def swallowed(kind: str) -> list[dict[str, object]]:
        try:
            signal.raise_signal(signal.SIGINT)  # a real Ctrl-C, as the terminal sends it
        except KeyboardInterrupt:
            pass  # what happens when it lands in a __del__ or a gc callback
        return real(kind)  # type: ignore[return-value]

    monkeypatch.setattr(paraplan.api, "preset_rows", swallowed)
    code, _, err = run(["gpus"], capsys)
    assert code == 130
    assert err.strip() == "interrupted"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_output_to_a_full_device_is_one_line_exit_1() -> None:
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "paraplan", "models"], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == ["error: cannot write the output: No space left on device"]


EVIL = "evil\x1b]0;pwned\x07[link=http://x.example]click[/link]\x1b[31m"


def test_names_with_escape_sequences_and_markup_print_literally(tmp_path: Path, narrow: None,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    gpu = tmp_path / "gpu.yaml"
    gpu.write_text(json.dumps({"base": "h100-80gb", "name": EVIL}), encoding="utf-8")
    outputs = []
    for args in (["estimate", "--model", "llama3-8b", "--gpu", str(gpu), "--num-gpus", "8", "--seq-len", "4096",
                  "--gbs", "64", "--tp", "2"],
                 ["plan", "--model", "llama3-8b", "--gpu", str(gpu), "--num-gpus", "8", "--seq-len", "4096",
                  "--gbs", "64", "--top", "2"]):
        code, out, err = run(args, capsys)
        assert code == 0, err
        outputs.append(out + err)
    for out in outputs:
        assert "\x1b" not in out and "\x07" not in out
        assert "evil\\x1b]0;pwned\\x07[link=http://x.example]click[/link]\\x1b[31m" in out


def test_error_lines_carry_no_escape_bytes(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["estimate", "--model", "no-such\x1b[2J", "--gpu", "h100-80gb", "--num-gpus", "8",
                        "--seq-len", "4096", "--gbs", "64"], capsys)
    assert code == 1
    assert "\x1b" not in err and "\\x1b[2J" in err and len(err.strip().splitlines()) == 1


def test_explain_save_writes_the_plan_as_plan_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16", "--seq-len", "8192", "--gbs", "256"]
    a, b = tmp_path / "plan.json", tmp_path / "explain.json"
    assert run(["plan", *args, "--save", str(a)], capsys)[0] == 0
    code, out, _ = run(["explain", *args, "--save", str(b)], capsys)
    assert code == 0 and "why " in out
    assert json.loads(b.read_text()) == json.loads(a.read_text())


def test_report_takes_recompute_modules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["report", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8", "--seq-len", "4096",
            "--gbs", "64", "--top", "2"]
    code, _, err = run([*args, "--recompute-modules", "bogus", "-o", str(tmp_path / "bad.html")], capsys)
    assert code == 1 and err.startswith("error: --recompute-modules: unknown 'bogus' (allowed:")
    assert not (tmp_path / "bad.html").exists()
    out_html = tmp_path / "r.html"
    code, _, err = run([*args, "--recompute-modules", "core_attn,mlp", "-o", str(out_html)], capsys)
    assert code == 0, err
    assert out_html.stat().st_size > 0


def _modules_after(args: list[str]) -> list[str]:
    """The heavy modules loaded once ``main(args)`` has run in a fresh interpreter."""
    code = ("import json, sys\nfrom paraplan.cli import main\n"
            f"rc = main({args!r})\n"
            f"print('\\nLOADED', json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]), rc)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "80"})
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("LOADED") and line.endswith(" 0"), proc.stdout + proc.stderr
    return list(json.loads(line[len("LOADED "):line.rindex(" ")]))


@pytest.mark.parametrize("args", [["--version"], ["--help"], []], ids=["version", "help", "bare"])
def test_version_and_help_import_no_heavy_module(args: list[str]) -> None:
    assert _modules_after(args) == []


@pytest.mark.parametrize("args", [["models"], ["gpus", "--format", "json"]], ids=" ".join)
def test_models_and_gpus_import_no_heavy_module(args: list[str]) -> None:
    """They read the packaged preset index and skip typer's option parsing (tests/cli/test_startup.py)."""
    assert _modules_after(args) == []


def test_shell_completion_completes_commands_and_options() -> None:
    env = {**os.environ, "_PARAPLAN_COMPLETE": "complete_bash", "COMP_WORDS": "paraplan pl", "COMP_CWORD": "1"}
    proc = subprocess.run([sys.executable, "-m", "paraplan"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.stdout.split() == ["plan"]
    env.update(COMP_WORDS="paraplan plan --recompute-mo", COMP_CWORD="2")
    proc = subprocess.run([sys.executable, "-m", "paraplan"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.stdout.split() == ["--recompute-modules"]


def test_install_completion_writes_the_bash_script(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "SHELL": "/bin/bash"}
    proc = subprocess.run([sys.executable, "-m", "paraplan", "--install-completion", "bash"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    script = tmp_path / ".bash_completions" / "paraplan.sh"
    assert "_PARAPLAN_COMPLETE" in script.read_text()


def test_plain_escapes_control_and_bidi_characters() -> None:
    assert cli_app.plain("a\x1b[31mb\nc\u202ed") == "a\\x1b[31mb\\nc\\u202ed"
    assert cli_app.plain("llama3-70b (8/node)") == "llama3-70b (8/node)"
