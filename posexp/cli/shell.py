"""The shells' side of tab completion: the script bash and zsh load, how they ask, and how it is installed.

One script serves both shells (:data:`SCRIPT`). On TAB it runs ``posexp`` with the line typed so far in
``_POSEXP_COMPLETE_LINE``; :func:`posexp.cli.main` sees ``_POSEXP_COMPLETE_SHELL`` and answers through
:func:`answer` before the app (Hydra, torch) is loaded. The answer is a first line ``KIND:WORD`` (``words``,
or ``dirs`` / ``files`` for the shell to list paths matching ``WORD``), then one candidate a line. bash gets the
part after its word break (:func:`reply_text`), so the user's ``COMP_WORDBREAKS`` stays as it is (Hydra's own script
removes ``=`` from it for every command of the shell). A key (``encoder=``, ``train.``) gets no space after it.

``posexp --install-completion`` (:func:`install`) writes the script where bash or zsh reads it at start;
``posexp train -sc install=bash``, the way Hydra documents, prints the same script (:func:`hydra_request`).
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from posexp.errors import PosexpError

SHELL_VAR = "_POSEXP_COMPLETE_SHELL"
LINE_VAR = "_POSEXP_COMPLETE_LINE"
BREAKS_VAR = "_POSEXP_COMPLETE_WORDBREAKS"
SHELLS = ("bash", "zsh")
# bash's COMP_WORDBREAKS unless the user changed it
DEFAULT_WORDBREAKS = " \t\n\"'@><=;|&(:"

SCRIPT = r"""#compdef posexp
# Tab completion of posexp, for bash and zsh (installed by: posexp --install-completion).
# On TAB the shell gives posexp the line typed so far; posexp answers without loading torch.
if [ -n "${ZSH_VERSION-}" ]; then

_posexp() {
    local -a reply items bare
    local kind
    reply=( "${(@f)$(_POSEXP_COMPLETE_SHELL=zsh _POSEXP_COMPLETE_LINE="${(j: :)words[1,CURRENT]}" \
        "${words[1]}" 2>/dev/null)}" )
    kind=${reply[1]%%:*}
    items=( ${reply[2,-1]} )
    bare=( ${(M)items:#*[=.]} )   # keys (encoder=, train.): no space after them
    items=( ${items:#*[=.]} )
    case $kind in
        dirs) compset -P '*='; _files -/ ;;
        files) compset -P '*='; _files ;;
    esac
    (( ${#bare} )) && compadd -S '' -- "${bare[@]}"
    (( ${#items} )) && compadd -- "${items[@]}"
    return 0
}
if [ "${funcstack[1]-}" = _posexp ]; then
    _posexp "$@"  # loaded from fpath (~/.zfunc/_posexp) at the first TAB: complete now
else
    (( $+functions[compdef] )) || { autoload -Uz compinit && compinit; }
    compdef _posexp posexp
fi

else

_posexp() {
    local -a reply
    local kind cur
    COMPREPLY=()
    mapfile -t reply < <(_POSEXP_COMPLETE_SHELL=bash _POSEXP_COMPLETE_LINE="${COMP_LINE:0:COMP_POINT}" \
        _POSEXP_COMPLETE_WORDBREAKS="$COMP_WORDBREAKS" "$1" 2>/dev/null)
    if [[ ${#reply[@]} -eq 0 ]]; then
        compopt -o default  # no answer from posexp: file names, as without completion
        return 0
    fi
    kind=${reply[0]%%:*}
    cur=${reply[0]#*:}
    case $kind in
        dirs) compopt -o filenames; mapfile -t COMPREPLY < <(compgen -d -- "$cur") ;;
        files) compopt -o filenames; mapfile -t COMPREPLY < <(compgen -f -- "$cur") ;;
    esac
    COMPREPLY+=( "${reply[@]:1}" )
    if [[ ${#COMPREPLY[@]} -eq 1 && ${COMPREPLY[0]} == *[=.] ]]; then
        compopt -o nospace  # a key (encoder=, train.): the value follows
    fi
    return 0
}
complete -F _posexp posexp

fi
"""

UNINSTALL = """if [ -n "${ZSH_VERSION-}" ]; then compdef -d posexp; else complete -r posexp 2>/dev/null; fi
unset -f _posexp 2>/dev/null
"""


def requested() -> bool:
    """Whether this process was started by the completion script, to answer a TAB."""
    return os.environ.get(SHELL_VAR) in SHELLS


def answer() -> None:
    """Print the reply to the TAB the environment describes (:data:`SHELL_VAR`, :data:`LINE_VAR`)."""
    text = reply_text(os.environ[SHELL_VAR], os.environ.get(LINE_VAR, ""),
                      os.environ.get(BREAKS_VAR, DEFAULT_WORDBREAKS))
    print(text)


def split_line(line: str) -> Tuple[List[str], str]:
    """A command line typed up to the cursor as the shell will pass it: the complete words, and the word being typed
    (quotes and backslashes removed; an open quote is closed at the cursor)."""
    for close in ("", '"', "'"):
        try:  # the cursor marked with a NUL, so that a word being typed is told from a finished one
            *words, last = shlex.split(line + "\0" + close)
            return words, last[:-1]
        except ValueError:
            continue
    return line.split(), ""


def reply_text(shell: str, line: str, wordbreaks: str = DEFAULT_WORDBREAKS) -> str:
    """The answer to a TAB at the end of ``line`` (``posexp ...``): ``KIND:WORD``, then the candidates.

    bash's readline replaces only the text after the last of its word-break characters (``encoder=ro``: ``ro``), so
    bash gets each candidate from there on, when the word was typed without quotes or backslashes; zsh replaces the
    whole word and gets whole words.
    """
    from posexp.cli.completion import complete

    words, typed = split_line(line)
    reply = complete(words[1:], typed)
    plain = line.endswith(typed) and line[:len(line) - len(typed)][-1:].isspace()  # typed as it stands
    breaks = set(wordbreaks) - set("\"'")  # quotes start a quoted word; this one is unquoted
    cut = max((i + 1 for i, ch in enumerate(typed) if ch in breaks), default=0) if shell == "bash" and plain else 0
    items = [item[cut:] for item in reply.items if item.startswith(typed[:cut])]
    return "\n".join([f"{reply.kind}:{typed[cut:]}", *items])


def detect_shell() -> Optional[str]:
    """The shell posexp was started from (the parent process, else ``$SHELL``)."""
    try:
        import shellingham  # Typer's dependency, which reads the parent processes

        return shellingham.detect_shell()[0]
    except Exception:  # noqa: BLE001 - ImportError, ShellDetectionFailure: fall back on the login shell
        return Path(os.environ.get("SHELL", "")).name or None


def install(shell: Optional[str], home: Path) -> Tuple[Path, Path]:
    """Install completion for ``shell`` under ``home``: bash reads ``~/.bash_completions/posexp.sh`` from
    ``~/.bashrc``, zsh loads ``~/.zfunc/_posexp`` through ``fpath`` (a line added to ``~/.zshrc``). Running it
    again replaces the script and adds no line twice (the paths of Typer's installer, whose script it replaces).

    Returns:
        The script written and the start-up file that loads it.

    Raises:
        PosexpError: ``shell`` is not bash or zsh.
    """
    if shell == "bash":
        script, rc = home / ".bash_completions" / "posexp.sh", home / ".bashrc"
        # single-quoted as before (a second install finds its line), a quote inside the path escaped: '\''
        line = "source '" + str(script).replace("'", "'\\''") + "'"
    elif shell == "zsh":
        script, rc = home / ".zfunc" / "_posexp", home / ".zshrc"
        line = "fpath+=~/.zfunc; autoload -Uz compinit; compinit"
    else:
        raise PosexpError(f"--install-completion: posexp completes in bash and zsh, not in {shell or 'this shell'}; "
                          "in one of them run posexp --install-completion there, or load the script of "
                          "posexp --show-completion yourself")
    from posexp.runs.atomic import atomic_write_bytes

    atomic_write_bytes(script, SCRIPT.encode())
    present = rc.read_text() if rc.is_file() else ""
    if line not in present.splitlines():
        with rc.open("a") as f:  # appended in place: a start-up file that is a link stays one
            f.write(("\n" if present and not present.endswith("\n") else "") + line + "\n")
    return script, rc


def hydra_request(args: Sequence[str]) -> Optional[str]:
    """What ``-sc install=bash`` (Hydra's ``--shell-completion``) prints for a posexp Hydra app: posexp's own
    script, which completes every subcommand, to ``eval``; ``uninstall=bash`` undoes it. None without ``-sc``.

    Raises:
        PosexpError: another request (Hydra's ``query=``, which posexp's script does not use) or shell.
    """
    if not any(a in ("-sc", "--shell-completion") for a in args):
        return None
    asked = [a for a in args if re.fullmatch(r"(install|uninstall|query)=\S*", a)]
    action, _, shell = (asked[0] if asked else "=").partition("=")
    if action in ("install", "uninstall") and shell in SHELLS:
        return SCRIPT if action == "install" else UNINSTALL
    given = f" {asked[0]}" if asked else ""
    raise PosexpError(f"-sc{given}: choose install=bash or install=zsh (to eval: eval \"$(posexp train -sc "
                      "install=bash)\"), or uninstall=bash / uninstall=zsh; posexp --install-completion installs "
                      "it for good")


def install_completion_option(value: bool) -> None:
    """``posexp --install-completion``: install the script for the shell the user runs, say where, and stop (an
    error said in one line by the app, as a command's)."""
    import typer

    if not value:
        return
    name = detect_shell()
    script, rc = install(name, Path.home())
    print(f"{name} completion of posexp installed in {script}, loaded by {rc}; it works in {name} shells started "
          "from now on")
    raise typer.Exit()


def show_completion_option(value: bool) -> None:
    """``posexp --show-completion``: print the script (bash and zsh) and stop."""
    import typer

    if value:
        print(SCRIPT, end="")
        raise typer.Exit()
