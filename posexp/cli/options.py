"""The subcommands, their arguments and their options, declared once: the app builds each command's Typer arguments
and options from here (:func:`argument`, :func:`option`) and tab completion (:mod:`posexp.cli.completion`) offers the
same names and completes their values, so an argument or option added here is completed with nothing else to edit.

A TAB reads this module, so it imports the standard library alone: Typer when the app builds an option, reporting's
metric registry when ``report``'s options are read. The Hydra apps' options are Hydra's flags, which Typer passes on
(``tests/unit/cli`` holds them equal to Hydra's parser).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Dict, Optional, Tuple, Union

# What completes an option's value besides a list of choices, or an argument's words (posexp.cli.completion reads these)
DIR, KEYS, METRICS, OVERRIDES = "dir", "keys", "metrics", "overrides"
RUNS_OR_OVERRIDES, RUNS_AND_EVAL = "runs or overrides", "runs and eval"
ENCODER, ENCODER_OPTIONS = "encoder", "encoder options"
OVERWRITE = "--overwrite"  # posexp.runs.lock.OVERWRITE_FLAG
ALLOW_CHANGED = "--allow-changed-encoder"  # posexp.commands.plugin_source.ALLOW_FLAG
HELP = ("--help", "-h")
ROOT = "posexp"  # the root's own options: --install-completion


@dataclass(frozen=True)
class Option:
    """One option of a subcommand.

    Attributes:
        names: its names, the long one first.
        help: what ``--help`` says of it.
        default: its value when not given; False: a flag, which takes no value; ``...``: required.
        values: what completes its value: the choices, or :data:`DIR` (a folder), :data:`KEYS` (config keys,
            comma-separated), :data:`METRICS`, :data:`OVERRIDES` (``KEY=VALUE`` of the training config).
    """

    names: Tuple[str, ...]
    help: str = ""
    default: Any = None
    values: Union[str, Tuple[str, ...]] = ()

    @property
    def flag(self) -> bool:
        return self.default is False


@dataclass(frozen=True)
class Argument:
    """One positional argument of a subcommand.

    Attributes:
        name: its parameter's name in the app's command.
        help: what ``--help`` says of it.
        values: what completes its words: :data:`DIR` (run folders), :data:`OVERRIDES` (Hydra overrides of ``app``),
            :data:`RUNS_OR_OVERRIDES` (run folders where a path is typed, else overrides of ``app``),
            :data:`RUNS_AND_EVAL` (run folders and ``eval.KEY=VALUE``), :data:`ENCODER` (a registered encoder),
            :data:`ENCODER_OPTIONS` (``KEY=VALUE`` of the encoder the argument before names).
        first: what completes its first word where that differs (a run folder before a fine-tune's overrides).
        app: the Hydra app (its config's name) whose overrides complete it.
        metavar: its name in ``--help``; empty: Typer's, the name in capitals.
        required: False: the command runs without it.
        many: it takes any number of words (one at least where required); else one.
    """

    name: str
    help: str
    values: str
    first: str = ""
    app: str = "config"
    metavar: str = ""
    required: bool = True
    many: bool = False


Declared = Tuple[Union[Argument, Option], ...]  # a command's arguments, then its options


def find(command: str, name: str) -> Optional[Option]:
    """The option of ``command`` one of whose names is ``name``; None if it has none."""
    return next((o for o in options(command) if name in o.names), None)


def option(command: str, name: str, **extra: Any) -> Any:
    """The option of ``command`` named ``name`` as Typer declares it (``extra``: what only the app has, a
    callback)."""
    import typer

    declared = find(command, name)
    return typer.Option(declared.default, *declared.names, help=declared.help, **extra)


def argument(command: str, name: str) -> Any:
    """The argument of ``command`` named ``name`` as Typer declares it."""
    import typer

    declared = next(a for a in arguments(command) if a.name == name)
    return typer.Argument(... if declared.required else None, help=declared.help, show_default=False,
                          metavar=declared.metavar or None)


@lru_cache(maxsize=None)
def options(command: str) -> Tuple[Option, ...]:
    """The options of ``command`` (:data:`ROOT`: the root's own), in the order ``--help`` lists them."""
    return tuple(o for o in (_root if command == ROOT else COMMANDS[command])() if isinstance(o, Option))


@lru_cache(maxsize=None)
def arguments(command: str) -> Tuple[Argument, ...]:
    """The positional arguments of ``command``, in their order on the command line."""
    return tuple(a for a in COMMANDS[command]() if isinstance(a, Argument))


def _hydra(*more: Option) -> Tuple[Option, ...]:
    """Hydra's flags worth offering (posexp refuses --config-path); ``-sc install=bash`` prints posexp's script."""
    return (Option(("-m", "--multirun"), default=False), Option(("--cfg", "-c"), values=("job", "hydra", "all")),
            Option(("--package", "-p")), Option(("--resolve",), default=False),
            Option(("--info", "-i"), values=("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")),
            Option(("--config-dir", "-cd"), values=DIR),
            Option(("--shell-completion", "-sc"), default=False,  # what follows it (install=bash) is Hydra's argument
                   values=("install=bash", "install=zsh", "uninstall=bash", "uninstall=zsh")),
            Option(("--hydra-help",), default=False), Option((OVERWRITE,), default=False), *more)


def _root() -> Tuple[Option, ...]:
    return (Option(("--install-completion",), "Install tab completion for the shell you run (bash or zsh): "
                   "subcommands, encoder=NAME, train.KEY=, run folders.", False),
            Option(("--show-completion",), "Print the completion script (bash and zsh), to load it yourself.", False))


def _report() -> Declared:
    from posexp.reporting.metrics import ACCURACY, PERPLEXITY, metric_help
    from posexp.reporting.selection import DEFAULT_METRICS, DEFAULT_TOLERANCE
    from posexp.reporting.task_report import DEFAULT_TASK_METRICS, RULER_METRIC

    return (
        Argument("folders", "Run folders or sweep folders (searched recursively).", DIR, many=True),
        Option(("--out", "-o"), "Where to write report.md (with figures), summary.md and summary.csv; default: "
               "reports/NAME/ in the folder given (here, for several).", values=DIR),
        Option(("--by",), "Group by config keys, comma-separated: encoder,base,train_len,model.n_layers,... Runs with "
               "the same values (e.g. seeds) are averaged with a 95% t-interval.", values=KEYS),
        Option(("--metric",), f"Summary columns, comma-separated: {metric_help(PERPLEXITY)}. Default: "
               f"{','.join(DEFAULT_METRICS)}. Task runs: {metric_help(ACCURACY)}. Default: "
               f"{','.join(DEFAULT_TASK_METRICS)} (and {RULER_METRIC} for RULER's tasks).", values=METRICS),
        Option(("--tolerance",), "Tolerance of a plain maxlen: 0.1 = ppl within +10% of the training-length value.",
               DEFAULT_TOLERANCE),
        Option(("--sort",), "Sort by a metric, --by key or n; --sort=-auc for descending."),
        Option(("--where",), "Keep runs with KEY=VALUE (or KEY!=VALUE; VALUE may be a,b for any of); repeatable.",
               values=OVERRIDES),
        Option(("--format", "-f"), "Table format: rich, markdown, csv, json, latex. All but rich print only the "
               "table, for redirecting.", "rich",
               ("rich", "markdown", "csv", "json", "latex")),  # posexp.reporting.render.FORMATS: a TAB loads no rich
        Option(("--strict",), "Stop with exit status 2 at the first run whose results.json cannot be read, instead "
               "of leaving it out.", False),
        Option(("--baseline",), "With --by: the reference group the others are compared with, KEY=VALUE (e.g. "
               "encoder=rope or encoder=rope,base=100); default: the first group.", values=OVERRIDES),
        Option(("--view",), "Which rows to show, KEY=VALUE of protocol, scaling, window, sinks: window=128 (the "
               "window baseline of posexp eval RUN eval.window=128), protocol=last_k, scaling=yarn; default: the "
               "plain rows. Written to reports/view-.../ of the folder given.",
               values=("protocol=nonoverlap", "protocol=sliding", "protocol=last_k", "window=", "sinks=", "scaling=")),
        Option(("--margin",), "With --by: the largest difference that does not matter, 2% (of the reference group's "
               "mean) or 0.05 (in each metric's unit); a group whose 90% interval lies within it is 'equivalent "
               "within 2%' (two one-sided tests). Without it no equivalence is claimed."),
        Option(("--cols",), "Pivot: the values of a row or run key as columns, the first the baseline, each other "
               "with its paired difference beside it: window (plain vs window, with a verdict), scaling (none vs "
               "yarn), protocol, seed, encoder, base, any config key. Lines: --by.", values=KEYS))


def _eval() -> Declared:
    return (Argument("args", "Run folders (or sweep folders: every run under them), then eval.* overrides, e.g. "
                     "eval.lengths=[256,1024,8192] eval.protocol=last_k eval.last_k=64 eval.scaling=yarn; or hf:MODEL "
                     "(a transformers model folder or Hub name) with Hydra overrides (hf:MODEL --cfg job lists them).",
                     RUNS_AND_EVAL, metavar="RUN_DIR|hf:MODEL|eval.KEY=VALUE", many=True),
            Option(("--strict",), "Stop with exit status 2, before evaluating anything, at the first run whose "
                   "results.json cannot be read.", False),
            Option((ALLOW_CHANGED,), "Evaluate runs of a plugin encoder (or task) whose source file changed since "
                   "they were trained.", False))


def _check() -> Declared:
    return (Argument("encoder", "A registered encoder (posexp list shows them), built-in or plugin.", ENCODER),
            Argument("options", "The encoder's options, KEY=VALUE, e.g. base=500; train_len=N: the length check "
                     "reaches 16N (default 128).", ENCODER_OPTIONS, required=False, many=True),
            Option(("--format", "-f"), "table, json or markdown (for CI).", "table",
                   ("table", "json", "markdown")),  # posexp.commands.check.FORMATS: it imports torch
            Option(("--config-dir", "-cd"), "Your config folder, whose encoder/*.yaml name their modules.",
                   values=DIR))


def _search() -> Declared:
    return (
        Argument("target", "A rope run folder, or hf:PATH_OR_NAME (a transformers model with RoPE).", DIR),
        Argument("overrides", "For hf: models, settings as posexp eval hf: takes them, e.g. data=text data.path=DIR "
                 "hf.bos=false.", OVERRIDES, app="pretrained", required=False, many=True),
        Option(("--target-len",), "The context length the factors are for (tokens).", ...),
        Option(("--out", "-o"), "The search's folder (state.json, factors.json); default RUN/longrope/N, or "
               "outputs/longrope/NAME/N.", values=DIR),
        Option(("--objective",), "ppl (LongRoPE: held-out perplexity) or needle (LongRoPE2: perplexity of passkey "
               "answers planted in long documents).", "ppl",
               ("ppl", "needle")),  # posexp.evaluation.longrope_search.OBJECTIVES: it imports torch
        Option(("--tokens",), "ppl: held-out targets scored per candidate.", 8192),
        Option(("--needles",), "needle: documents with a planted passkey per candidate.", 8),
        Option(("--population",), "Candidates per generation.", 12),
        Option(("--generations",), "Generations after the first.", 5),
        Option(("--parents",), "The best that breed the next generation.", 4),
        Option(("--seed",), "The search's random numbers.", 0),
        Option(("--start",), "Fix LongRoPE's n^ (first positions left unscaled); default: searched over 0, 1, 2, 4, "
               "..., 256."),
        Option(("--restart",), "Start over, dropping the state a stopped search left.", False))


def _train() -> Declared:
    return (Argument("overrides", "Hydra overrides, e.g. encoder=rope base=10000; -m to sweep; --help for Hydra's "
                     "help.", OVERRIDES, required=False, many=True), *_hydra())


def _analyze() -> Declared:
    return (Argument("overrides", "Hydra overrides, e.g. encoder=rope base=10000 (-m to sweep, --help for Hydra's "
                     "help); or trained run folders, then analyze.KEY=VALUE.", RUNS_OR_OVERRIDES, app="analyze",
                     required=False, many=True), *_hydra())


def _finetune() -> Declared:
    return (Argument("args", "The run folder to fine-tune, then Hydra overrides, e.g. train_len=512 scaling=yarn "
                     "train.steps=200; -m to sweep; --help for Hydra's help.", OVERRIDES, first=DIR, app="finetune",
                     metavar="RUN_DIR [OVERRIDES]", required=False, many=True),
            *_hydra(Option((ALLOW_CHANGED,), default=False)))


# the subcommands, in the order a TAB offers them
COMMANDS: Dict[str, Callable[[], Declared]] = {
    "train": _train, "analyze": _analyze, "finetune": _finetune,
    "eval": _eval, "report": _report, "check": _check, "search": _search,
    "resume": lambda: (Argument("run_dir", "The run folder of a killed or interrupted posexp train run, or a stopped "
                                "sweep's folder (its interrupted jobs resumed, those never started run).", DIR,
                                metavar="RUN_DIR"),
                       Option((ALLOW_CHANGED,), "Resume a run of a plugin encoder (or task) whose source file "
                              "changed since training started.", False)),
    "list": lambda: (Option(("--config-dir", "-cd"), "A config folder of yours (as posexp train --config-dir): its "
                            "encoders are listed too.", values=DIR),),
    "export": lambda: (Argument("run_dir", "A finished run folder (posexp train's).", DIR),
                       Argument("out_dir", "The model folder to write; new or empty.", DIR),
                       Option((OVERWRITE,), "Replace OUT_DIR if it already holds a model folder (an earlier export).",
                              False)),
}
