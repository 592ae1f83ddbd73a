"""attnres analysis: result records (docs/results_schema.md) -> scaling-law fits, compute multipliers with intervals,
figures (docs/analysis.md); pandas, scipy and matplotlib, never torch. Entry point: ``python -m analysis --help``."""
