"""The flows: what each pipeline does, as a library function the absl shells in ``pipelines/`` and the tests call
(``profile``, ``rewrite``, ``verify``, ``demo``, ``bench``), and the schedule request they share (``common``)."""
