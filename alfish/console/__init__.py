"""How a run talks with whoever started it: signals in (Ctrl-C, a job scheduler's SIGTERM, SIGUSR2 for a checkpoint),
the "write a checkpoint?" question after a crash on a terminal, the progress line out, and the watchdog that ends a
process whose main thread is stuck. Nothing here imports alfish outside this folder: the loop (``alfish.trainer``)
polls and feeds these, and a test child can load them without torch."""
