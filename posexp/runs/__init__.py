"""The run folder: its layout and readers (:mod:`posexp.runs.layout`), claiming and locking it
(:mod:`posexp.runs.lock`), atomic writes (:mod:`posexp.runs.atomic`), the provenance results.json records
(:mod:`posexp.runs.provenance`) and the files rendered from the rows (:mod:`posexp.runs.results`,
:mod:`posexp.runs.task_results`).

``layout``, ``lock`` and ``atomic`` are torch-free: ``posexp report`` reads every run through them
where no model can be built. ``provenance`` and the rendered results are written by the run that
measured them and import what it measured with (torch's version, the evaluation's row helpers).
"""
