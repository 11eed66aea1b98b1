"""``task=reverse``: write the input string backwards after the separator.

The "reverse string" task of Delétang et al. 2023 (§4, deterministic context-free) and Ruoss et al. 2023
(Table 1), and Kazemnejad et al. 2023's reversal task (§4).
"""

from __future__ import annotations

import numpy as np

from posexp.tasks.task import TASKS
from posexp.tasks.strings import StringTask


@TASKS.register("reverse")
class Reverse(StringTask):
    citation = "Delétang et al. 2023; Ruoss et al. 2023; Kazemnejad et al. 2023"
    default_symbols = 16

    def answer_of(self, strings: np.ndarray) -> np.ndarray:
        return strings[:, ::-1].copy()
