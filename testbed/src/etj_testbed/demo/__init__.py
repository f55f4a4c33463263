"""The spot-interruption demo (`etj demo`)."""
