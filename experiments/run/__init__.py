"""A run's lifecycle around its training: ``identity`` (config_hash, run id and directory), ``run_plan`` (data, model
config, steps), ``locks``, ``interrupts``, ``errors``, ``checkpoint_io``, ``record_builder`` (the record in the
making and how every ending is recorded), ``run_env``, ``wandb_setup``, ``job`` (exit statuses) and ``budgets``
(several budgets from one run). Imports nothing from experiments.training (tests/test_import_graph.py)."""
