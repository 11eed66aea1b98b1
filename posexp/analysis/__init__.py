"""Analysis: ``posexp analyze``, the geometry of an encoding and the attention of trained runs.

Owns the ``analyze.*`` schema (:mod:`.schema`), the score-map math (:mod:`.geometry`:
pure tensor math), its figures (:mod:`.drawing`, in the house style of :mod:`posexp.plots.style`),
the Hydra job and its sweep comparison (:mod:`.app`), and trained runs' attention (:mod:`.attention`).

It sits at the top beside the commands: it may import the encoders, the model, the
config, the run folder, evaluation's task instances and the commands' run loading;
nothing in posexp imports it but the CLI.
"""
