"""The operator's view of the cluster: nodes, pods and interruption signals, parsed into value objects."""
