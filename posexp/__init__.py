"""posexp: train small causal LMs with one positional encoding each and measure how
their perplexity holds up at longer contexts than they were trained on."""

__version__ = "0.1.0"
