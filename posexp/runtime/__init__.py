"""Where and how a run computes: the device and processes (:mod:`posexp.runtime.device`), the precision
(:mod:`posexp.runtime.precision`), memory, its estimates and its peaks (:mod:`posexp.runtime.memory`), and the
CPU threads (:mod:`posexp.runtime.threads`): one owner of each.
"""
