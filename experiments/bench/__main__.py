"""``python -m experiments.bench``: experiments.bench.cli.main."""

from .cli import main

main()
