"""Running models: TFLM (the tflite-micro wheel) and TF Lite interpreters, arena measurement, crash isolation,
and the host runner for custom-mode models."""
