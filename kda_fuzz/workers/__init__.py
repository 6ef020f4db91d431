"""Worker processes: the fork server, and targets run in a supervised worker (crash and
hang isolation)."""
