"""Analysis: ``posexp analyze``, the geometry of an encoding and the attention of trained runs.

Owns the ``analyze.*`` schema (:mod:`.schema`), the score-map math (:mod:`.geometry`:
pure tensor math), its figures (:mod:`.figures`), the Hydra job and its sweep
comparison (:mod:`.app`), and trained runs' attention (:mod:`.attention`).

It may import the encoders, the model, the config and the commands' run loading;
nothing in posexp imports it but the CLI.
"""
