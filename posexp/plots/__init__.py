"""Every figure posexp draws, in one house style (:mod:`posexp.plots.style`): perplexity and loss against
context length (:mod:`posexp.plots.perplexity`), task accuracy (:mod:`posexp.plots.accuracy`).
Torch-free; matplotlib is imported only when a figure is drawn.
"""
