"""What a run folder shows a person: ``results.md``, ``results.csv``, the console table and the figures of a perplexity
or task run, and the curve drawn during training. Above runs/ (the folder's files and row format), plots/ and
evaluation/ (loss by position), below the commands that write a run.
"""
