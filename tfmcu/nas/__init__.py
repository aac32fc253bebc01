"""Joint architecture + patch-schedule search: the supernet's training and the evolutionary search."""
