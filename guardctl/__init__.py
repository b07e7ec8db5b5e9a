"""guardctl: find, prove and handle grey (slow) GPU nodes in Slurm clusters."""

__version__ = "0.1.0"
