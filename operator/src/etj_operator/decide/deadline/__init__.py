"""The deadline policy: on-demand workers a job needs to finish on time, its cost and schedule (pure)."""
