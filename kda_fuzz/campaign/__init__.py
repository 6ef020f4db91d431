"""A fuzz campaign: the plan, the runner, supervised jobs, shards, calibration,
minimization and the example database."""
