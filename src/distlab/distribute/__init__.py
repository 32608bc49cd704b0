"""Running across processes: who this process is, what the workers agree on, how they stop.

`cluster` reads this process's role (`Worker`: chief or worker, its peers) from TF_CONFIG or
Slurm; `multi_worker` broadcasts the chief's decisions and checkpoint state and names a lost
peer; `preemption` turns SIGTERM/SIGINT into a checkpoint at a step boundary; `watchdog` is
the separate process that reports a cluster that never forms.
"""
