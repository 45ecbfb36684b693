"""`import` reads units as systemd does: quoting, escapes, continuations, prefixes, Environment= and EnvironmentFile=."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.importing.source import ImportProblem, from_command, from_unit
from supervisor.importing.unitfile import parse_env_file, parse_unit
from supervisor.importing.words import UnitSyntaxError, expand_argv, split_exec, split_words


def test_quotes_anywhere_in_a_word_are_removed_and_join_the_word() -> None:
    """A quoted section joins the word it touches (`--x="a b"` is one word `--x=a b`); both quote kinds work."""
    assert split_words("""a "b c" 'd "e"' --x="1 2"z""").words == ["a", "b c", 'd "e"', "--x=1 2z"]


def test_c_escapes_are_decoded_inside_and_outside_quotes() -> None:
    """`\\s`, `\\x2d`, `\\101`, `\\u00e9`, `\\"` decode; a backslash escapes inside single quotes too."""
    words = split_words(r"""a\sb \x2d \101 \u00e9 "q\"q" 'it\'s' x\\y""").words
    assert words == ["a b", "-", "A", "é", 'q"q', "it's", "x\\y"]


def test_an_unknown_escape_is_kept_with_a_warning() -> None:
    """`\\d` is not an escape systemd knows: kept verbatim (its relaxed retry), and the import says so."""
    found = split_words(r"--regex \d+")
    assert found.words == ["--regex", "\\d+"]
    assert found.warnings and "\\d" in found.warnings[0]


def test_unbalanced_quotes_refuse_the_setting() -> None:
    """An unclosed quote makes the whole setting invalid, as systemd ignores it."""
    with pytest.raises(UnitSyntaxError):
        split_words("""--a "b c""")


def test_exec_prefixes_and_argv0() -> None:
    """`-`, `+`, `!`, `:` are stripped from the program; with `@` the second word is argv[0], not an argument."""
    (cmd,) = split_exec("-+/usr/bin/python3 -m sglang.launch_server")
    assert (cmd.path, cmd.argv, cmd.prefixes) == (
        "/usr/bin/python3",
        ("/usr/bin/python3", "-m", "sglang.launch_server"),
        "-+",
    )
    (at,) = split_exec("@/usr/bin/python3 sglang-kimi -m sglang.launch_server")
    assert at.path == "/usr/bin/python3" and at.argv == ("sglang-kimi", "-m", "sglang.launch_server")
    (raw,) = split_exec(":/bin/echo $X")
    assert not raw.expands_variables


def test_semicolons_separate_commands_and_escaped_ones_are_arguments() -> None:
    """A lone `;` starts another command line; `\\;` is a literal `;` argument."""
    first, second = split_exec(r"/bin/echo a \; b ; /bin/echo c")
    assert first.argv == ("/bin/echo", "a", ";", "b") and second.argv == ("/bin/echo", "c")


def test_a_relative_program_with_a_slash_is_refused() -> None:
    """systemd takes an absolute path or a plain file name, never `bin/python`."""
    with pytest.raises(UnitSyntaxError):
        split_exec("venv/bin/python -m sglang.launch_server")


def test_variables_expand_as_systemd_expands_them() -> None:
    """`$X` alone splits its value into words (quotes respected), `${X}` is one exact value, `$$` a dollar,
    an unset variable expands to nothing and is reported."""
    env = {"ARGS": "--tp 2 '--x=a b'", "M": "/m 1"}
    unset: set[str] = set()
    out = expand_argv(("prog", "$ARGS", "${M}", "--p=${M}", "$$HOME", "$NOPE", "${NOPE2}"), env, unset)
    assert out == ["prog", "--tp", "2", "--x=a b", "/m 1", "--p=/m 1", "$HOME", ""]
    assert unset == {"NOPE", "NOPE2"}


def test_unit_continuations_skip_comment_lines_and_keep_sections() -> None:
    """A trailing backslash joins lines with a space; comment lines inside the continuation are skipped."""
    text = "[Service]\nExecStart=/bin/a \\\n# note\n  b \\\n; other\n  c\n[Install]\nWantedBy=x\n"
    settings = parse_unit(text, "u.service")
    assert [(s.section, s.key, s.value) for s in settings] == [
        ("Service", "ExecStart", "/bin/a    b    c"),
        ("Install", "WantedBy", "x"),
    ]
    assert split_exec(settings[0].value)[0].argv == ("/bin/a", "b", "c")


def test_environment_file_syntax() -> None:
    """EnvironmentFile=: comments, `'…'` verbatim over lines, `"…"` with shell escapes, unquoted values keep
    inner spaces and trailing-backslash continuations; invalid names are skipped."""
    text = (
        '# comment\n; also\nA=plain value  \nB=\'single $x\n two\'\nC="d\\"q\\$ \\n"\n'
        "D=one\\\ntwo\n1BAD=x\nE = spaced\nnoequals\n"
    )
    found, ignored = parse_env_file(text)
    assert found == [
        ("A", "plain value"),
        ("B", "single $x\n two"),
        ("C", 'd"q$ \\n'),
        ("D", "onetwo"),
        ("E", "spaced"),
    ]
    assert len(ignored) == 1 and "1BAD" in ignored[0]


def test_environment_lines_and_files_apply_in_systemd_order(tmp_path: Path) -> None:
    """Environment= lines in order (later wins, empty resets), then every EnvironmentFile= on top, in order."""
    first, second = tmp_path / "first.env", tmp_path / "second.env"
    first.write_text("A=from-first\nB=from-first\n")
    second.write_text("B=from-second\n")
    unit = tmp_path / "s.service"
    unit.write_text(
        "[Service]\n"
        f"EnvironmentFile={first}\n"
        'Environment="A=line one" B=line C=line\n'
        "Environment=\n"
        "Environment=\"A=after reset\" 'D=x y'\n"
        f"EnvironmentFile=-{second}\n"
        f"EnvironmentFile=-{tmp_path / 'absent.env'}\n"
        "ExecStart=/bin/prog $A ${D}\n"
    )
    source = from_unit(unit)
    assert source.env == {"A": "from-first", "D": "x y", "B": "from-second"}
    assert source.argv == ["/bin/prog", "from-first", "x y"]
    assert any("absent.env: missing, allowed" in line for line in source.read)


def test_a_missing_required_environment_file_is_a_check_not_a_crash(tmp_path: Path) -> None:
    """EnvironmentFile= without `-` that is missing: systemd would refuse to start; the import says so."""
    unit = tmp_path / "s.service"
    unit.write_text(f"[Service]\nEnvironmentFile={tmp_path / 'nope'}\nExecStart=/bin/prog\n")
    assert any("systemd would refuse to start" in line for line in from_unit(unit).check)


def test_drop_ins_override_in_name_order(tmp_path: Path) -> None:
    """`UNIT.d/*.conf` are read after the unit; `ExecStart=` empty resets the command before a new one."""
    unit = tmp_path / "s.service"
    unit.write_text("[Service]\nExecStart=/bin/old --a\nEnvironment=X=1\n")
    (tmp_path / "s.service.d").mkdir()
    (tmp_path / "s.service.d" / "10-new.conf").write_text("[Service]\nExecStart=\nExecStart=/bin/new --b\n")
    (tmp_path / "s.service.d" / "20-env.conf").write_text("[Service]\nEnvironment=X=2\n")
    source = from_unit(unit)
    assert source.argv == ["/bin/new", "--b"] and source.env == {"X": "2"}


def test_a_unit_without_one_command_is_refused(tmp_path: Path) -> None:
    """No ExecStart=, or several commands (Type=oneshot): the import names the problem and stops."""
    unit = tmp_path / "s.service"
    unit.write_text("[Service]\nExecStart=/bin/a ; /bin/b\n")
    with pytest.raises(ImportProblem, match="2 ExecStart= commands"):
        from_unit(unit)


def test_command_line_takes_leading_assignments_as_env() -> None:
    """Leading NAME=value words (or `env NAME=value …`) are the command line's environment, the rest its command."""
    source = from_command(["env", "CUDA_VISIBLE_DEVICES=0,1", "X=a b", "/opt/py", "-m", "m", "--tp", "2"])
    assert source.env == {"CUDA_VISIBLE_DEVICES": "0,1", "X": "a b"}
    assert source.argv == ["/opt/py", "-m", "m", "--tp", "2"]


def test_a_shell_wrapper_that_activates_a_venv_is_unwrapped(tmp_path: Path) -> None:
    """`bash -c "source VENV/bin/activate && cd D && exec python3 -m …"`: the venv's python runs the command,
    `$MODEL` comes from the unit's environment, a single-quoted JSON stays one argument, the `cd` is a check."""
    unit = tmp_path / "s.service"
    unit.write_text(
        "[Service]\nEnvironment=MODEL=/models/Qwen3-8B\n"
        'ExecStart=/bin/bash -c "source /opt/sglang/venv/bin/activate && cd /srv && X=1 exec python3 '
        '-m sglang.launch_server --model-path $MODEL --tp 2 --json-model-override-args \'{\\"a\\": 1}\'"\n'
    )
    source = from_unit(unit)
    assert source.argv == [
        "/opt/sglang/venv/bin/python3", "-m", "sglang.launch_server", "--model-path", "/models/Qwen3-8B",
        "--tp", "2", "--json-model-override-args", '{"a": 1}',
    ]  # fmt: skip
    assert source.env == {"MODEL": "/models/Qwen3-8B", "X": "1"}
    assert any("cd /srv" in line for line in source.check)


def test_a_shell_script_that_does_more_is_refused() -> None:
    """A pipe (or any other shell feature) in the wrapper: refused, pointing to `import -- COMMAND`."""
    with pytest.raises(ImportProblem, match="give the SGLang command after `--`"):
        from_command(["bash", "-c", "python3 -m sglang.launch_server --model-path m | tee /var/log/x"])
