"""Hugging Face transformers on both sides of posexp: a pretrained causal LM evaluated under posexp's protocols
(``posexp eval hf:MODEL``), and a posexp run exported as a transformers model folder (``posexp export RUN DIR``).

Needs the ``hf`` extra (``pip install -e '.[hf]'``: transformers and accelerate); nothing else in posexp imports
transformers at module level.
"""
