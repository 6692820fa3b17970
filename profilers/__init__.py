"""profilers."""
