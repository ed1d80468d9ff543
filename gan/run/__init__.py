"""A run, below training and evaluation: its config's types (schema), its module (the networks and their
state) and how it is built from a config (build), its checkpoints and how they are read (checkpoint,
legacy), and how a run directory is found and loaded (load)."""
