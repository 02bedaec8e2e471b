"""Long runs and faults: the soak and engine-crash recovery."""
