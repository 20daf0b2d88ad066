"""A run end to end and its commands: the runner, the run directory, what a run starts from, the
warm start, tracking, presets, how a command takes a config, and `minirl export`."""
