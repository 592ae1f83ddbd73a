"""What Lightning runs: ``module`` (the LightningModule), ``train_step`` (the step, defined once), ``optim`` (the
optimizers and schedules), ``callbacks``, ``datamodule``, ``instantiators`` (callbacks, loggers, trainer and the
``_target_`` factories) and ``compiler`` (the compiled step's process-wide settings)."""
