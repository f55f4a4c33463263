"""What the operator creates for a job, as plain dicts: names, pods, the Service, the data plane (pure)."""
