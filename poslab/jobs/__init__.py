"""Job machinery: many independent trainings on a local pool or on Ray, and grids of runs.

* :mod:`poslab.jobs.runner`: :func:`~poslab.jobs.runner.train_many` and its executors (the local
  process pool, Ray), the executor a command installs for its child steps, shards of a batch job.
* :mod:`poslab.jobs.pool_worker`: the worker side of the local pool (stopping cleanly, never
  outliving its parent).
* :mod:`poslab.jobs.ray_connect`: joining a Ray cluster with a deadline.
* :mod:`poslab.jobs.sweep`: ``poslab sweep``, a resumable grid of ``poslab train`` runs.

The lab's experiments and ``poslab sweep`` hand their trainings here; nothing here knows an experiment.
"""
