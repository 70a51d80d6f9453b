"""Sweep and tune: many runs of one scenario, their comparison, the tuner's search, and their rendering."""
