"""Kueue admission of etj jobs (docs/kueue.md): which Workloads a job has and what they allow, pure."""
