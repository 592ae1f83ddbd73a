"""Multirun studies over the training app: sweep configs live in conf/sweep/, launchers in conf/launcher/."""
