"""attnres analysis: result records -> scaling-law fits, compute multipliers with intervals, figures.

Reads only the result-record contract (docs/results_schema.md); needs pandas, scipy and matplotlib but never
torch.  Entry point: ``python -m analysis {fit,paper} --help``.  Schema of the outputs: docs/analysis.md.
"""
