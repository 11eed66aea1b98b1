"""The subcommands and their options, declared once: the app builds each command's Typer options from here
(:meth:`Option.typer`) and tab completion (:mod:`posexp.cli.completion`) offers the same names and completes their
values, so an option added here is completed with nothing else to edit.

A TAB reads this module, so it imports no more than the standard library: Typer when the app builds an option,
reporting's metric registry only when ``report``'s options are read. The Hydra apps' options are Hydra's flags
(:func:`posexp.cli.hydra_flags.option_strings` holds them equal); Typer passes those on without declaring them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Dict, Tuple, Union

# What completes an option's value besides a list of choices (posexp.cli.completion reads these)
DIR, KEYS, METRICS, OVERRIDES = "dir", "keys", "metrics", "overrides"
OVERWRITE = "--overwrite"  # posexp.runs.lock.OVERWRITE_FLAG
ALLOW_CHANGED = "--allow-changed-encoder"  # posexp.commands.encoder_source.ALLOW_FLAG
HELP = ("--help", "-h")


@dataclass(frozen=True)
class Option:
    """One option of a subcommand.

    Attributes:
        names: its names, the long one first.
        help: what ``--help`` says of it.
        default: its value when not given; False: a flag, which takes no value; ``...``: required.
        values: what completes its value: the choices, or one of :data:`DIR` (a folder), :data:`KEYS` (config keys,
            comma-separated), :data:`METRICS`, :data:`OVERRIDES` (``KEY=VALUE`` of the training config).
        show_default: ``--help`` shows the default.
    """

    names: Tuple[str, ...]
    help: str = ""
    default: Any = None
    values: Union[str, Tuple[str, ...]] = ()
    show_default: bool = True

    @property
    def flag(self) -> bool:
        return self.default is False

    def typer(self, **extra: Any) -> Any:
        """This option as Typer declares it (``extra``: Typer's settings that only the app has, a callback)."""
        import typer

        return typer.Option(self.default, *self.names, help=self.help, show_default=self.show_default, **extra)


def option(command: str, name: str, **extra: Any) -> Any:
    """The Typer option ``name`` (the parameter's name) of ``command``."""
    return options(command)[name].typer(**extra)


@lru_cache(maxsize=None)
def options(command: str) -> Dict[str, Option]:
    """``parameter name -> Option`` of ``command`` (:data:`ROOT`: the root's own), in the order ``--help`` lists
    them."""
    return (_root if command == ROOT else COMMANDS[command])()


def _hydra(*more: Tuple[str, Option]) -> Dict[str, Option]:
    """Hydra's flags worth offering (posexp refuses --config-path); ``-sc install=bash`` prints posexp's script."""
    return {o.names[0]: o for o in (
        Option(("-m", "--multirun"), default=False), Option(("--cfg", "-c"), values=("job", "hydra", "all")),
        Option(("--package", "-p")), Option(("--resolve",), default=False),
        Option(("--info", "-i"), values=("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")),
        Option(("--config-dir", "-cd"), values=DIR),
        Option(("--shell-completion", "-sc"), default=False,  # what follows it (install=bash) is Hydra's argument
               values=("install=bash", "install=zsh", "uninstall=bash", "uninstall=zsh")),
        Option(("--hydra-help",), default=False), Option((OVERWRITE,), default=False))} | dict(more)


def _root() -> Dict[str, Option]:
    return {"install_completion": Option(("--install-completion",), "Install tab completion for the shell you run "
                                         "(bash or zsh): subcommands, encoder=NAME, train.KEY=, run folders.", False),
            "show_completion": Option(("--show-completion",), "Print the completion script (bash and zsh), to load "
                                      "it yourself.", False)}


def _report() -> Dict[str, Option]:
    from posexp.reporting.metrics import ACCURACY, PERPLEXITY, metric_help
    from posexp.reporting.selection import DEFAULT_METRICS, DEFAULT_TOLERANCE
    from posexp.reporting.task_report import DEFAULT_TASK_METRICS, RULER_METRIC

    return {
        "out": Option(("--out", "-o"), "Where to write report.md (with figures), summary.md and summary.csv; "
                                       "default: reports/NAME/ in the folder given (here, for several).",
                      values=DIR),
        "by": Option(("--by",), "Group by config keys, comma-separated: encoder,base,train_len,model.n_layers,... "
                                "Runs with the same values (e.g. seeds) are averaged with a 95% t-interval.",
                     values=KEYS),
        "metric": Option(("--metric",), f"Summary columns, comma-separated: {metric_help(PERPLEXITY)}. Default: "
                                        f"{','.join(DEFAULT_METRICS)}. Task runs: {metric_help(ACCURACY)}. Default: "
                                        f"{','.join(DEFAULT_TASK_METRICS)} (and {RULER_METRIC} for RULER's tasks).",
                         values=METRICS),
        "tolerance": Option(("--tolerance",), "Tolerance of a plain maxlen: 0.1 = ppl within +10% of the "
                                              "training-length value.", DEFAULT_TOLERANCE),
        "sort": Option(("--sort",), "Sort by a metric, --by key or n; --sort=-auc for descending."),
        "where": Option(("--where",), "Keep runs with KEY=VALUE (or KEY!=VALUE; VALUE may be a,b for any of); "
                                      "repeatable.", values=OVERRIDES),
        # posexp.reporting.render.FORMATS, copied: a TAB imports no rich
        "fmt": Option(("--format", "-f"), "Table format: rich, markdown, csv, json, latex. All but rich print only "
                                          "the table, for redirecting.", "rich",
                      ("rich", "markdown", "csv", "json", "latex")),
        "strict": Option(("--strict",), "Stop with exit status 2 at the first run whose results.json cannot be "
                                        "read, instead of leaving it out.", False),
        "baseline": Option(("--baseline",), "With --by: the reference group the others are compared with, "
                                            "KEY=VALUE (e.g. encoder=rope or encoder=rope,base=100); default: the "
                                            "first group.", values=OVERRIDES),
        "view": Option(("--view",), "Which rows to show, KEY=VALUE of protocol, scaling, window, sinks: window=128 "
                                    "(the window baseline of posexp eval RUN eval.window=128), protocol=last_k, "
                                    "scaling=yarn; default: the plain rows. Written to reports/view-.../ of the folder "
                                    "given.", values=("protocol=nonoverlap", "protocol=sliding", "protocol=last_k",
                                                      "window=", "sinks=", "scaling=")),
        "margin": Option(("--margin",), "With --by: the largest difference that does not matter, 2% (of the "
                                        "reference group's mean) or 0.05 (in each metric's unit); a group whose 90% "
                                        "interval lies within it is 'equivalent within 2%' (two one-sided tests). "
                                        "Without it no equivalence is claimed."),
        "cols": Option(("--cols",), "Pivot: the values of a row or run key as columns, the first the baseline, each "
                                    "other with its paired difference beside it: window (plain vs window, with a "
                                    "verdict), scaling (none vs yarn), protocol, seed, encoder, base, any config key. "
                                    "Lines: --by.", values=KEYS),
    }


def _eval() -> Dict[str, Option]:
    return {"strict": Option(("--strict",), "Stop with exit status 2, before evaluating anything, at the first run "
                                            "whose results.json cannot be read.", False),
            "allow_changed_encoder": Option((ALLOW_CHANGED,), "Evaluate runs of a plugin encoder whose source file "
                                            "changed since they were trained.", False)}


def _resume() -> Dict[str, Option]:
    return {"allow_changed_encoder": Option((ALLOW_CHANGED,), "Resume a run of a plugin encoder whose source file "
                                            "changed since training started.", False)}


def _check() -> Dict[str, Option]:
    return {"fmt": Option(("--format", "-f"), "table, json or markdown (for CI).", "table",
                          ("table", "json", "markdown")),  # posexp.commands.check.FORMATS: it imports torch
            "config_dir": Option(("--config-dir", "-cd"), "Your config folder, whose encoder/*.yaml name their "
                                 "modules.", values=DIR, show_default=False)}


def _list() -> Dict[str, Option]:
    return {"config_dir": Option(("--config-dir", "-cd"), "A config folder of yours (as posexp train --config-dir): "
                                 "its encoders are listed too.", values=DIR, show_default=False)}


def _export() -> Dict[str, Option]:
    return {"overwrite": Option((OVERWRITE,), "Replace OUT_DIR if it already holds a model folder (an earlier "
                                "export).", False)}


def _search() -> Dict[str, Option]:
    return {
        "target_len": Option(("--target-len",), "The context length the factors are for (tokens).", ...,
                             show_default=False),
        "out": Option(("--out", "-o"), "The search's folder (state.json, factors.json); default RUN/longrope/N, or "
                                       "outputs/longrope/NAME/N.", values=DIR, show_default=False),
        # posexp.evaluation.longrope_search.OBJECTIVES, copied: it imports torch
        "objective": Option(("--objective",), "ppl (LongRoPE: held-out perplexity) or needle (LongRoPE2: perplexity "
                                              "of passkey answers planted in long documents).", "ppl",
                            ("ppl", "needle")),
        "tokens": Option(("--tokens",), "ppl: held-out targets scored per candidate.", 8192),
        "needles": Option(("--needles",), "needle: documents with a planted passkey per candidate.", 8),
        "population": Option(("--population",), "Candidates per generation.", 12),
        "generations": Option(("--generations",), "Generations after the first.", 5),
        "parents": Option(("--parents",), "The best that breed the next generation.", 4),
        "seed": Option(("--seed",), "The search's random numbers.", 0),
        "start": Option(("--start",), "Fix LongRoPE's n^ (first positions left unscaled); default: searched over 0, "
                                      "1, 2, 4, ..., 256.", show_default=False),
        "restart": Option(("--restart",), "Start over, dropping the state a stopped search left.", False),
    }


ROOT = "posexp"
# the subcommands, in the order a TAB offers them
COMMANDS: Dict[str, Callable[[], Dict[str, Option]]] = {
    "train": _hydra, "analyze": _hydra, "finetune": lambda: _hydra((ALLOW_CHANGED, Option((ALLOW_CHANGED,),
                                                                                          default=False))),
    "eval": _eval, "resume": _resume, "report": _report, "check": _check, "list": _list, "export": _export,
    "search": _search,
}
