"""One line of ``posexp check``'s table: a property, whether it holds, and the number that says so."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

PASS, FAIL, NOT_APPLICABLE = "pass", "fail", "n/a"
ERROR = "error"  # the check could not measure (out of memory, its own code failed): no finding either way


@dataclass(frozen=True)
class Check:
    """The outcome of one conformance check.

    Attributes:
        name: what is checked, e.g. ``causality``.
        status: ``pass``, ``fail``, ``n/a`` (the encoding does not claim the property, or has no such hook) or
            ``error`` (nothing could be measured: out of memory, or a measurement of cost crashed).
        measured: the number measured (a max abs difference, a growth exponent, ...), None if nothing was.
        tolerance: the bound ``measured`` is held to, in words (``<= 1e-06``).
        detail: how it was measured, or what went wrong.
    """

    name: str
    status: str
    measured: Optional[float] = None
    tolerance: str = ""
    detail: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def within(name: str, measured: float, bound: float, detail: str, fmt: str = ".0e") -> Check:
    """``pass`` when ``measured <= bound`` (a NaN fails), else ``fail``."""
    ok = measured <= bound  # False for NaN
    return Check(name, PASS if ok else FAIL, measured, f"<= {bound:{fmt}}", detail)
