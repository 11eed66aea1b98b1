"""``task=copy``: write the input string again after the separator.

The "duplicate string" task of Delétang et al. 2023 ("Neural Networks and the Chomsky Hierarchy", §4, the
context-sensitive tasks) and Ruoss et al. 2023 ("Randomized Positional Encodings Boost Length Generalization
of Transformers", Table 1), and the copy task of Kazemnejad et al. 2023 ("The Impact of Positional Encoding
on Length Generalization in Transformers", §4). Here the answer follows the input in one causal sequence
(``x SEP x``), scored token by token with the true prefix (teacher forcing).
"""

from __future__ import annotations

import numpy as np

from posexp.tasks.task import TASKS
from posexp.tasks.strings import StringTask


@TASKS.register("copy")
class Copy(StringTask):
    citation = "Delétang et al. 2023; Ruoss et al. 2023; Kazemnejad et al. 2023"
    default_symbols = 16

    def answer_of(self, strings: np.ndarray) -> np.ndarray:
        return strings.copy()
