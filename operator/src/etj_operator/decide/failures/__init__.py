"""Failures judged from the job alone: the failure window, avoided nodes, crash loops, unstarted pods."""
