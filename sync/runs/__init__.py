"""Steps 4-5 and 8: evaluating a run, publishing it, launching and rerunning Cloud jobs."""
