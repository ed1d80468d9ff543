"""A run, below training and evaluation: its module (the networks and their state) and how it is built from a
config (build), its checkpoints and how they are read (checkpoint, legacy), fine-tuning's start (finetune), the
hold on a run directory (hold), and how a run directory is found and loaded (load). The config's types are
gan/config/schema.py's."""
