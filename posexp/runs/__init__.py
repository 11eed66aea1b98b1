"""The run folder, torch-free: its layout and readers (:mod:`posexp.runs.layout`), claiming and locking it
(:mod:`posexp.runs.lock`), atomic writes (:mod:`posexp.runs.atomic`), the provenance results.json records
(:mod:`posexp.runs.provenance`) and the files rendered from the rows (:mod:`posexp.runs.results`,
:mod:`posexp.runs.task_results`).
"""
