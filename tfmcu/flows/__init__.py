"""The flows: what each pipeline does, as a library function the absl shells in ``pipelines/`` and the tests call
(``profile``, ``rewrite``, ``verify``, ``demo``), and the schedule request they share (``common``). ``make bench``'s
measurements are not flows: they are the package ``benchmarks``, above the library."""
