"""Live figures for other tools: ``prometheus`` serves them on an HTTP endpoint (``--prometheus``), from the
metrics ``metrics`` computes. Consumers of analysis, like render; nothing here imports rich or the CLI."""
