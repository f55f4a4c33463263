"""Pure decisions: the planner, the job status it writes, and the pods it asks for (no Kubernetes I/O)."""
