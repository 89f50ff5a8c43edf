"""GPU verification: the agent (runs on GPU hosts), profiles, reports, remote execution."""
