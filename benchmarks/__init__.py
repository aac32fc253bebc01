"""The measurements of ``make bench`` (``pipelines.bench``), apart from the library: they import ``tfmcu`` only."""
