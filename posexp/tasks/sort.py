"""``task=sort``: write the input's symbols in ascending order after the separator.

The sorting task of Kazemnejad et al. 2023 (§4; also "bucket sort" in Delétang et al. 2023 and Ruoss et al.
2023, Table 1): symbols are drawn with repetition, so the answer is the multiset in order.
"""

from __future__ import annotations

import numpy as np

from posexp.tasks.task import TASKS
from posexp.tasks.strings import StringTask


@TASKS.register("sort")
class Sort(StringTask):
    citation = "Kazemnejad et al. 2023; Delétang et al. 2023 (bucket sort)"
    default_symbols = 16

    def answer_of(self, strings: np.ndarray) -> np.ndarray:
        return np.sort(strings, axis=1)
