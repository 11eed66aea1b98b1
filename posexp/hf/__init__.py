"""Hugging Face transformers on both sides of posexp: a pretrained causal LM evaluated under posexp's protocols
(``posexp eval hf:MODEL``), and a posexp run exported as a transformers model folder (``posexp export RUN DIR``).

Needs the ``hf`` extra (``pip install -e '.[hf]'``: transformers and accelerate); nothing else in posexp imports
transformers at module level.
"""

from posexp.errors import PosexpError


def require_transformers(command: str) -> None:
    """Refuse ``command`` in one line where transformers is not installed (it is the ``hf`` extra).

    Raises:
        PosexpError: naming the command and the install that brings transformers.
    """
    import importlib.util

    missing = [name for name in ("transformers", "safetensors") if importlib.util.find_spec(name) is None]
    if missing:
        raise PosexpError(f"{command} needs {' and '.join(missing)}, not installed here: "
                          "pip install -e '.[hf]' (in a checkout) or pip install 'posexp[hf]'")
