"""Where and how a run computes: the device and processes (:mod:`posexp.runtime.device`), the precision
(:mod:`posexp.runtime.precision`), memory, its estimates and its peaks (:mod:`posexp.runtime.memory`), the
CPU threads (:mod:`posexp.runtime.threads`) and the consoles it writes to (:mod:`posexp.runtime.terminal`): one
owner of each.
"""
