"""The run folder: its layout and readers (:mod:`posexp.runs.layout`), claiming and locking it
(:mod:`posexp.runs.lock`), atomic writes (:mod:`posexp.runs.atomic`), the provenance results.json records
(:mod:`posexp.runs.provenance`), the row format (:mod:`posexp.runs.row`) and the curve's csv
(:mod:`posexp.runs.curve`). What is rendered from the rows for a person (results.md, the figures) lives a floor
above, in :mod:`posexp.rendering`.

``layout``, ``lock`` and ``atomic`` are torch-free: ``posexp report`` reads every run through them
where no model can be built.
"""
