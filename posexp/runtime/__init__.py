"""Where and how a run computes: the device and processes (:mod:`posexp.runtime.device`), the precision
(:mod:`posexp.runtime.precision`) and memory, its estimates and its peaks (:mod:`posexp.runtime.memory`):
one owner of each.
"""
