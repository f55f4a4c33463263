"""What the planner writes to status: phase, conditions, counts, resize history (pure)."""
