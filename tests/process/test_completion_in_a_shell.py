"""Tab completion as a user gets it in a shell: the script in a real bash and zsh (the ``=`` word break, no space
after a key), loaded by the line ``--install-completion`` writes. What a TAB offers, and the install commands, are
tested in this process (tests/unit/cli/test_completion.py); that a TAB never loads torch is
tests/process/test_fresh_interpreter.py."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from posexp.cli import shell
from posexp.config.schema import config_dir


def _yamls(group: str) -> list[str]:
    return sorted(p.stem for p in (config_dir() / group).glob("*.yaml"))


# -- the script in the shells themselves ----------------------------------------------------------------

@pytest.fixture
def posexp_on_path(tmp_path):
    """A folder holding a ``posexp`` that runs this checkout (``python -m posexp``), and PATH with it first."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "posexp"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m posexp "$@"\n')
    exe.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"


BASH_DRIVER = r"""
source "$1" && echo sourced || exit 1
function=$(complete -p posexp | sed -E 's/.* -F ([^ ]+) .*/\1/')  # the function the script registered
compopt() { options+=" $*"; }  # readline's options, which only a completion started by readline may set
tab() {
    COMP_LINE=$1 COMP_POINT=${#1} COMP_WORDBREAKS=$' \t\n"\'@><=;|&(:' options=""
    # bash's own split: at blanks, and each run of word-break characters a word of its own
    read -ra COMP_WORDS <<< "$(sed -E 's/([=:@]+)/ \1 /g' <<< "$1")"
    COMP_CWORD=${#COMP_WORDS[@]}
    [[ $1 == *' ' ]] || COMP_CWORD=$((COMP_CWORD - 1))
    "$function" posexp "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
    printf '%s|%s|%s\n' "$1" "${options# }" "${COMPREPLY[*]}"
}
tab "posexp train enc"
tab "posexp train encoder="
tab "posexp train encoder=ro"
tab "posexp train model=s"
tab "posexp train train.ste"
tab "posexp eval ou"
"""


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completion_function_fills_compreply(tmp_path, posexp_on_path):
    """The .bashrc line ``--install-completion`` writes, under a home whose name holds a quote and a blank
    (``source '/home/o'brien/…'`` broke every new shell of the user), loads the script; its function then fills
    COMPREPLY as bash's readline reads it."""
    home = tmp_path / "o'brien dir"
    home.mkdir()
    script, rc = shell.install("bash", home)
    assert str(script) in shlex.split(rc.read_text().splitlines()[-1])
    (tmp_path / "outputs").mkdir()
    out = subprocess.run(["bash", "--norc", "--noprofile", "-c", BASH_DRIVER, "bash", str(rc)], cwd=tmp_path,
                         env={**os.environ, "HOME": str(home), "PATH": posexp_on_path}, capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.splitlines() == [
        "sourced",
        "posexp train enc|-o nospace|encoder=",  # no space: the value follows
        f"posexp train encoder=||{' '.join(_yamls('encoder'))}",  # bash's word after = is empty
        "posexp train encoder=ro||rope",  # readline replaces "ro", the part after the =
        "posexp train model=s||small",
        "posexp train train.ste|-o nospace|train.steps=",
        "posexp eval ou|-o filenames|outputs",
    ], out.stderr


def _typed_in_a_terminal(argv: list[str], env: dict, setup: str, lines: list[str], cwd: Path) -> list[str]:
    """Start an interactive shell in a terminal, type each line with a TAB, and return each line as it then
    stands (a key bound in ``setup`` appends it to ``$OUT`` and clears it)."""
    import pty
    import select

    out, ready = cwd / "typed.txt", cwd / "ready"
    pid, fd = pty.fork()
    if pid == 0:  # the shell
        os.chdir(cwd)
        os.execvpe(argv[0], argv, {**env, "OUT": str(out)})
    try:
        os.write(fd, f"{setup}; : > {ready}\n".encode())
        deadline = time.time() + 60
        for keys in [None, *[f"{line}\t\x14" for line in lines]]:
            if keys is not None:
                os.write(fd, keys.encode())
            want = lines.index(keys[:-2]) + 1 if keys else 0
            while not (ready.exists() if keys is None else out.exists() and len(out.read_text().splitlines()) >= want):
                assert time.time() < deadline, out.read_text() if out.exists() else "the shell never answered"
                if select.select([fd], [], [], 0.05)[0]:
                    os.read(fd, 65536)  # the terminal's output, read so that the shell never blocks on it
        return out.read_text().splitlines()
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(fd)


LINES = ["posexp train enc", "posexp train encoder=ro", "posexp train model=s", "posexp train train.ste",
         "posexp tr", "posexp eval ou"]
# what the user then sees: a key stays open (no space), a value is done (a space), a folder ends in /
AFTER_TAB = ["posexp train encoder=", "posexp train encoder=rope ", "posexp train model=small ",
             "posexp train train.steps=", "posexp train ", "posexp eval outputs/"]


@pytest.mark.skipif(shutil.which("bash") is None or sys.platform == "win32", reason="no bash terminal")
def test_tab_in_an_interactive_bash_after_install_completion(tmp_path, posexp_on_path):
    shell.install("bash", tmp_path)
    (tmp_path / "outputs").mkdir()
    env = {"HOME": str(tmp_path), "PATH": posexp_on_path, "TERM": "dumb", "INPUTRC": "/dev/null"}
    setup = r"""bind -x '"\C-t": printf "%s\n" "$READLINE_LINE" >> "$OUT"; READLINE_LINE=""'"""
    typed = _typed_in_a_terminal(["bash", "--noprofile", "--rcfile", str(tmp_path / ".bashrc"), "-i"], env, setup,
                                 LINES, tmp_path)
    assert typed == AFTER_TAB


@pytest.mark.skipif(shutil.which("zsh") is None, reason="no zsh (apt-get install zsh)")
def test_tab_in_an_interactive_zsh_after_install_completion(tmp_path, posexp_on_path):
    shell.install("zsh", tmp_path)
    (tmp_path / "outputs").mkdir()
    env = {"HOME": str(tmp_path), "ZDOTDIR": str(tmp_path), "PATH": posexp_on_path, "TERM": "dumb"}
    setup = "dump() { print -r -- $BUFFER >> $OUT; BUFFER= }; zle -N dump; bindkey '^T' dump"
    typed = _typed_in_a_terminal(["zsh", "-d", "-i"], env, setup, LINES, tmp_path)
    assert typed == AFTER_TAB
