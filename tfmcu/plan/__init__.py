"""Planning on the IR: analytic profile, patch regions, TFLM arena prediction, one placer, offline memory plans,
and the one schedule search."""
