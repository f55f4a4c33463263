"""The Kubernetes side: kopf handlers, the per-job loop, the API client, metrics and the entry point."""
