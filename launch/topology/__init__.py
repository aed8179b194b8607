"""Where a run's processes live: the ``Cluster`` Protocol the run drives (``protocol``), the Ray
backend (``ray_cluster``, the only module of the project that imports Ray), the in-process
backend (``local_cluster``), what both make of their processes' answers (``combine``), the pure
placement of processes on nodes (``placement``) and the factory that picks the configured
backend (``factory``, the only module that knows both).

Imports launch/config/, launch/model/ (the warm start runs where the topology puts it) and the
lower packages.
"""
