"""The worker runtime: the ``Controller`` that runs tasks on any ``TaskStore``."""
