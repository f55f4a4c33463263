"""The planner: plan(job, observed) -> Plan, its named steps and what they read (pure)."""
