"""How a run talks with whoever started it: signals in (Ctrl-C, a job scheduler's SIGTERM, SIGUSR2 for a checkpoint),
the "write a checkpoint?" question after a crash on a terminal, and the progress line out. Nothing here imports
alfish: the loop (``alfish.trainer``) polls and feeds these, and a test child can load a module by its path."""
