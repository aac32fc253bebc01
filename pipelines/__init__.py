"""absl-flag command-line pipelines: thin shells over the tfmcu library."""
