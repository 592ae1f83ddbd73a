"""The config of a run, composed and checked before anything heavy runs: ``compose`` (conf/ with overrides),
``resolvers`` and ``config_schema`` (the ``attnres_*`` resolvers, the structured configs and the model node built as
an ``attnres.ModelConfig``), ``validation`` (the checks no schema makes). Imports nothing from experiments.run or
experiments.training (tests/test_import_graph.py)."""
