"""Live view: feeds of a run's newest steps and samples, their rolling figures, and the terminal view."""
