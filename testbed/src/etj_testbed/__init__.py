"""The test bed: the local control plane, process-backed nodes and the demo. The operator never imports it."""
