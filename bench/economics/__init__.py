"""Spot economics (issue 17): spot capacity traces, cost and goodput accounting, and the job simulator.

Pure code only; the real-bed replay driver is `bench/spot_replay.py` and the ResNet-50 projection
`bench/spot_project.py` (docs/economics.md).
"""
